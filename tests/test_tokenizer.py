"""Tokenizers load as Hugging Face loads them (issue 12, point 6)."""
import json

import pytest

from asap.model.errors import ModelLoadError
from asap.model.tokenizer import load_tokenizer, write_tokenizer

tokenizers = pytest.importorskip("tokenizers")

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
TEMPLATE = ("{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
            "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}{{ '<｜User｜>' + m['content'] }}"
            "{% elif m['role'] == 'assistant' %}{{ '<｜Assistant｜>' + m['content'] + eos_token }}"
            "{% else %}{{ raise_exception('unknown role ' + m['role']) }}{% endif %}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<｜Assistant｜>' }}{% endif %}")
TEXTS = ["Hello world", "", "  leading spaces and\nnewlines\t", "ünïcödé 🙂 text", "the the the there"]


def _bpe_tokenizer(path, config: dict, add_bos=True, add_eos=False):
    """A small byte-level BPE trained on a few sentences, with BOS/EOS special tokens, whose post-processor
    adds BOS (and EOS) as DeepSeek-V3's tokenizer.json does."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=[BOS, EOS, "<｜User｜>", "<｜Assistant｜>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog", "hello world", "there the then"] * 20,
                            trainer)
    if add_bos or add_eos:
        single = f"{BOS + ':0 ' if add_bos else ''}$A:0{' ' + EOS + ':0' if add_eos else ''}"
        tok.post_processor = processors.TemplateProcessing(
            single=single, special_tokens=[(t, tok.token_to_id(t)) for t in (BOS, EOS)])
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


@pytest.mark.parametrize("add_bos,add_eos,config_says", [(True, False, True), (False, False, True), (True, True, False),
                                                         (True, False, False)])
def test_ids_equal_transformers_autotokenizer(tmp_path, add_bos, add_eos, config_says):
    """config_says: tokenizer_config.json's add_bos_token, which transformers 5 ignores beside a tokenizer.json."""
    transformers = pytest.importorskip("transformers")
    d = _bpe_tokenizer(tmp_path / "tok", {
        "tokenizer_class": "LlamaTokenizerFast", "add_bos_token": config_says, "add_eos_token": False,
        "bos_token": {"__type": "AddedToken", "content": BOS, "lstrip": False, "normalized": True, "rstrip": False,
                      "single_word": False}, "eos_token": EOS, "chat_template": TEMPLATE}, add_bos, add_eos)
    ours, hf = load_tokenizer(d), transformers.AutoTokenizer.from_pretrained(str(d))
    for text in TEXTS:
        assert ours.encode(text) == hf(text)["input_ids"], text
    assert ours.add_bos_token == add_bos and ours.add_eos_token == add_eos
    if add_bos:
        assert ours.encode("hi")[0] == ours.bos_token_id == hf.bos_token_id
    assert ours.decode(ours.encode("hello world")) == hf.decode(hf("hello world")["input_ids"])


def test_chat_template_renders_as_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    d = _bpe_tokenizer(tmp_path / "tok", {"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": True,
                                          "bos_token": BOS, "eos_token": EOS, "chat_template": TEMPLATE})
    ours, hf = load_tokenizer(d), transformers.AutoTokenizer.from_pretrained(str(d))
    messages = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "the fox"},
                {"role": "user", "content": "there?"}]
    for gen in (True, False):
        text = ours.apply_chat_template(messages, add_generation_prompt=gen)
        assert text == hf.apply_chat_template(messages, add_generation_prompt=gen, tokenize=False)
        assert ours.apply_chat_template(messages, add_generation_prompt=gen, tokenize=True) == \
            list(hf.apply_chat_template(messages, add_generation_prompt=gen, tokenize=True, return_dict=False))
    assert text.startswith(BOS) and ours.encode(text, add_special_tokens=False).count(ours.bos_token_id) == 1
    with pytest.raises(ValueError, match="chat template: unknown role tool"):
        ours.apply_chat_template([{"role": "tool", "content": "x"}])


def test_a_chat_template_file_takes_priority_as_in_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    d = _bpe_tokenizer(tmp_path / "tok", {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS,
                                          "eos_token": EOS, "chat_template": "{{ 'from the config' }}"})
    (d / "chat_template.jinja").write_text(TEMPLATE)
    ours, hf = load_tokenizer(d), transformers.AutoTokenizer.from_pretrained(str(d))
    messages = [{"role": "user", "content": "hello there"}]
    assert ours.apply_chat_template(messages) == hf.apply_chat_template(messages, tokenize=False,
                                                                        add_generation_prompt=True)
    assert ours.apply_chat_template(messages).startswith(BOS + "<｜User｜>hello there")


def test_preset_tokenizer_covers_the_whole_vocabulary(tmp_path):
    write_tokenizer(tmp_path, 512)
    tok = load_tokenizer(tmp_path)
    assert tok._tok.get_vocab_size() == 512
    for i in range(512):
        assert tok.decode([i]) != "" or i < 256          # every id names a token (bytes may be partial UTF-8)
        assert tok._tok.id_to_token(i) is not None
    text = "plain text, ünïcode 🙂"
    assert tok.encode(text) == list(text.encode())       # still byte-level: id == byte, no BOS added
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.encode(chat)[0] == 257 and tok.encode(chat).count(258) == 1     # <|im_start|>, <|im_end|>


def test_lone_surrogate_is_a_value_error(tmp_path):
    write_tokenizer(tmp_path, 300)
    with pytest.raises(ValueError, match="lone surrogate"):
        load_tokenizer(tmp_path).encode("a\ud800b")


@pytest.mark.parametrize("content", ["{not json", '{"version": "1.0", "model": {"type": "Nope"}}', ""])
def test_a_corrupt_tokenizer_json_names_the_file(tmp_path, content):
    (tmp_path / "tokenizer.json").write_text(content)
    with pytest.raises(ModelLoadError, match="tokenizer.json: not a valid tokenizers file"):
        load_tokenizer(tmp_path)


def test_a_corrupt_tokenizer_config_names_the_file(tmp_path):
    write_tokenizer(tmp_path, 300)
    (tmp_path / "tokenizer_config.json").write_text("[1, 2")
    with pytest.raises(ModelLoadError, match="tokenizer_config.json: invalid JSON"):
        load_tokenizer(tmp_path)
