"""Promises of asap/model/tokenizer.py: a byte-level tokenizer any UTF-8 text round-trips through."""
import pytest

from asap.model.tokenizer import FILE, load_tokenizer, write_tokenizer

pytest.importorskip("tokenizers")


def test_byte_level_round_trip(tmp_path):
    assert write_tokenizer(tmp_path, 512) == tmp_path / FILE
    tok = load_tokenizer(tmp_path)
    text = "Hello, wörld 🙂\n\ttabs"
    ids = tok.encode(text)
    assert ids == list(text.encode()) and tok.decode(ids) == text
    assert tok.decode([256]) == "<|endoftext|>"


def test_needs_room_for_bytes_and_a_dir_without_one_has_none(tmp_path):
    with pytest.raises(ValueError, match="vocab_size >= 257"):
        write_tokenizer(tmp_path, 256)
    assert load_tokenizer(tmp_path) is None
