"""`vllm bench serve`'s datasets as ASAP workloads.

    mooncake   a Mooncake .jsonl[.gz] trace: its arrival times and prompt lengths
               (default: the sample shipped in the package)
    azure      an Azure LLM-inference .csv trace (--dataset-path required)
    random     prompt lengths uniform on [L (1 - r), L (1 + r)] (--random-input-len L,
               --random-range-ratio r), random token ids, Poisson arrivals
    sharegpt   a ShareGPT .json (--dataset-path): the first human turn of each
               conversation, shuffled by --seed, tokenized with --tokenizer

Arrivals: a trace's own unless --arrivals says otherwise; the others Poisson.
--request-rate (alias --rate) rescales them to that mean rate; `inf` sends every
request at once (vLLM's default). --burstiness B draws gamma gaps of shape B
(coefficient of variation 1/sqrt(B); B = 1 is Poisson), as vLLM does.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from asap.scheduler.request import Request
from asap.measure.metrics import parse_goodput
from asap.workload import Constant, Fixed, Gamma, LogNormal, Poisson, Uniform, Workload
from asap.workload.slo import SLO, add_slo_flag, parse_slo
from asap.workload.traces import default_trace_path

DATASETS = ("mooncake", "azure", "random", "sharegpt")
MIN_SHAREGPT_TOKENS = 4      # vLLM drops shorter ShareGPT prompts


@dataclass(frozen=True)
class AllAtOnce:
    """Every request arrives at 0: `--request-rate inf`."""

    def times(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return np.zeros(n)


@dataclass(frozen=True)
class PromptWorkload(Workload):
    """A Workload whose prompts are given token ids (ShareGPT text), cycled to each request's length."""
    prompts: tuple[tuple[int, ...], ...] = ()

    def build(self) -> list[Request]:
        out = []
        for r in super().build():
            ids = self.prompts[r.id % len(self.prompts)]
            prompt = list(ids) * math.ceil(r.num_tokens / len(ids))
            out.append(Request(r.id, r.num_tokens, arrival=r.arrival, deadline=r.deadline, meta=dict(r.meta),
                               prompt=prompt[:r.num_tokens] if self.with_prompts else None))
        return out


def random_lengths(input_len: int, range_ratio: float):
    """vLLM's random dataset: integers uniform on [int(L (1 - r)), int(L (1 + r))]."""
    if input_len < 1:
        raise ValueError(f"--random-input-len must be >= 1, got {input_len}")
    if not 0 <= range_ratio < 1:
        raise ValueError(f"--random-range-ratio must be in [0, 1), got {range_ratio}")
    lo, hi = max(1, int(input_len * (1 - range_ratio))), int(input_len * (1 + range_ratio))
    return Fixed(input_len) if lo == hi else Uniform(lo, hi)


def sharegpt_prompts(path: str | Path, tokenizer, num_prompts: int, seed: int) -> tuple[tuple[int, ...], ...]:
    """Token ids of the first turn of the first `num_prompts` usable conversations, shuffled by `seed`."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"--dataset-path {p}: file not found")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"--dataset-path {p}: not a ShareGPT JSON file ({e})") from None
    if not isinstance(data, list):
        raise ValueError(f"--dataset-path {p}: expected a JSON list of conversations")
    convs = [d["conversations"] for d in data if isinstance(d, dict) and isinstance(d.get("conversations"), list)
             and len(d["conversations"]) >= 2 and isinstance(d["conversations"][0], dict)
             and isinstance(d["conversations"][0].get("value"), str)]
    order = np.random.default_rng(seed).permutation(len(convs))
    prompts = []
    for i in order:
        ids = tokenizer.encode(convs[i][0]["value"])
        if len(ids) >= MIN_SHAREGPT_TOKENS:
            prompts.append(tuple(ids))
        if len(prompts) == num_prompts:
            break
    if not prompts:
        raise ValueError(f"--dataset-path {p}: no conversation with a first turn of >= {MIN_SHAREGPT_TOKENS} tokens")
    return tuple(prompts)


def load_text_tokenizer(spec: str | None, model: str):
    """--tokenizer (an HF directory with tokenizer.json), else the model's own."""
    from asap.model.materialize import resolve_model
    from asap.model.tokenizer import load_tokenizer
    path = Path(spec) if spec else resolve_model(model)
    tok = load_tokenizer(path) if path.is_dir() else None
    if tok is None:
        raise ValueError(f"no tokenizer.json in {path}: pass --tokenizer DIR (a directory with tokenizer.json)")
    return tok


def dataset_source(name: str, path: str | None) -> str | None:
    """The trace file for mooncake/azure; None for the synthetic datasets."""
    if name not in DATASETS:
        raise ValueError(f"unknown --dataset-name {name!r}; choose from {', '.join(DATASETS)}")
    if name == "mooncake":
        return str(path or default_trace_path())
    if name == "azure":
        if not path:
            raise ValueError("--dataset-name azure needs --dataset-path FILE.csv")
        return str(path)
    if name == "sharegpt" and not path:
        raise ValueError("--dataset-name sharegpt needs --dataset-path FILE.json")
    return None


def add_workload_flags(p) -> None:
    """The workload flags of `asap bench`, spelled as `vllm bench serve` spells them (old names as aliases)."""
    w = p.add_argument_group("workload (vllm bench serve's flags; older ASAP spellings as aliases)")
    w.add_argument("--dataset-name", default="mooncake", choices=DATASETS,
                   help="mooncake/azure: a trace's arrivals and lengths; random: uniform lengths; "
                        "sharegpt: real prompts (default: mooncake)")
    w.add_argument("--dataset-path", "--trace", dest="dataset_path", default=None,
                   help="the dataset file: Mooncake .jsonl[.gz], Azure .csv, ShareGPT .json; 'none' = synthetic "
                        "(--arrivals and --lengths); default for mooncake: the sample shipped in the package "
                        "(3,658 requests)")
    w.add_argument("--num-prompts", "--num-requests", dest="num_requests", type=int, default=100,
                   help="requests per run: the dataset's first N (default: %(default)s)")
    w.add_argument("--request-rate", "--rate", dest="rate", type=float, default=None,
                   help="mean request rate (req/s): rescales the arrivals; inf = all at once (default: a trace's "
                        "own arrivals; inf for random and sharegpt, as vLLM)")
    w.add_argument("--burstiness", type=float, default=None,
                   help="gamma arrivals of this shape (1 = Poisson, < 1 burstier), as vLLM; needs --request-rate")
    w.add_argument("--arrivals", default=None, choices=["trace", "poisson", "gamma", "constant"],
                   help="arrival process (default: trace for trace datasets, else poisson)")
    w.add_argument("--cv", type=float, default=2.0, help="--arrivals gamma: coefficient of variation of the gaps")
    w.add_argument("--time-scale", type=float, default=1.0, help="multiply arrival times (without --request-rate)")
    w.add_argument("--random-input-len", type=int, default=1024, help="random: mean prompt length (tokens)")
    w.add_argument("--random-range-ratio", type=float, default=0.0,
                   help="random: lengths uniform on [L (1 - r), L (1 + r)]")
    w.add_argument("--lengths", default="trace", help="override lengths: fixed:N | uniform:LO:HI | lognormal:MEAN:SIGMA")
    w.add_argument("--length-scale", type=float, default=1.0, help="multiply prompt lengths")
    w.add_argument("--min-tokens", type=int, default=1, help="raise shorter prompts to this length")
    w.add_argument("--max-tokens", type=int, default=None, help="clip prompt lengths (default: the model's limit)")
    w.add_argument("--seed", type=int, default=0, help="seed of arrivals, lengths, token ids and ShareGPT order")
    w.add_argument("--tokenizer", default=None,
                   help="sharegpt: directory with tokenizer.json (default: the --model's own)")
    w.add_argument("--goodput", nargs="+", metavar="KEY:MS",
                   help="vLLM's SLOs for request_goodput: ttft:MS (also the SLO of the attainment), e2el:MS, tpot:MS")
    add_slo_flag(w, None, what=" (the attainment's and --find-max-rate's; default: --goodput ttft:MS, else none)")


def parse_lengths(spec: str):
    """'trace' -> None (lengths from the trace), else a LengthDistribution."""
    kinds = {"fixed": (Fixed, int), "uniform": (Uniform, int, int), "lognormal": (LogNormal, float, float)}
    name, *params = spec.split(":")
    if name == "trace" and not params:
        return None
    if name not in kinds or len(params) != len(kinds[name]) - 1:
        raise ValueError(f"--lengths {spec!r}: expected trace, fixed:N, uniform:LO:HI or lognormal:MEAN:SIGMA")
    cls, *types = kinds[name]
    try:
        return cls(*(t(x) for t, x in zip(types, params)))
    except ValueError as e:
        raise ValueError(f"--lengths {spec!r}: {e}") from None


def workload_slo(args) -> SLO | None:
    """--slo, or --goodput ttft:MS (both given: they must agree)."""
    ttft = parse_goodput(args.goodput).get("ttft")
    slo = None if args.slo is None else parse_slo(args.slo)
    if ttft is not None and slo is not None and (abs(slo.fixed_s - ttft) > 1e-9 or slo.per_token_s):
        raise ValueError(f"--goodput ttft:{ttft * 1000:g} and --slo {args.slo} disagree; give one")
    return slo if slo is not None else None if ttft is None else SLO(ttft)


def build_workload(args, vocab_size: int, max_position: int, with_prompts: bool = True,
                   tokenizer=None) -> Workload:
    """The workload the flags describe (see the module docstring); `tokenizer` (anything with encode(text)):
    ShareGPT's when neither --tokenizer nor the model gives one (an http server's /tokenize)."""
    synthetic = args.dataset_path == "none"
    name = args.dataset_name
    trace = None if synthetic else dataset_source(name, args.dataset_path)
    has_times = trace is not None
    kind = args.arrivals or ("gamma" if args.burstiness is not None else "trace" if has_times else "poisson")
    rate = args.rate
    if rate is None and not has_times and not synthetic:
        rate = math.inf                         # vLLM's default for synthetic datasets
    cv = args.cv if args.burstiness is None else 1 / math.sqrt(_positive(args.burstiness, "--burstiness"))
    if rate is not None and math.isinf(rate):
        if args.arrivals not in (None, "trace") or args.burstiness is not None:
            raise ValueError("--request-rate inf sends everything at once: drop --arrivals/--burstiness")
        arrivals, rate = AllAtOnce(), None
    else:
        if kind == "trace" and not has_times:
            raise ValueError(f"--dataset-name {name} has no arrival times: choose --arrivals poisson/gamma/constant")
        arrivals = {"trace": None, "poisson": Poisson(1.0), "gamma": Gamma(1.0, cv), "constant": Constant(1.0)}[kind]
        if arrivals is not None and rate is None:
            raise ValueError(f"--arrivals {kind} needs --request-rate (--rate)")
    lengths = parse_lengths(args.lengths)
    if lengths is None and name == "random" and not synthetic:
        lengths = random_lengths(args.random_input_len, args.random_range_ratio)
    prompts = ()
    if name == "sharegpt" and not synthetic:
        tok = tokenizer or load_text_tokenizer(args.tokenizer, args.model)
        prompts = sharegpt_prompts(args.dataset_path, tok, args.num_requests, args.seed)
        if lengths is None:
            lengths = _InOrder(tuple(len(p) for p in prompts))
    if trace is None and lengths is None:
        raise ValueError("--dataset-path none needs --arrivals and --lengths that are not 'trace'")
    if trace is None and arrivals is None:
        raise ValueError("--dataset-path none needs --arrivals and --request-rate")
    max_tokens = min(args.max_tokens or max_position, max_position)
    common = dict(trace=trace, arrivals=arrivals, lengths=lengths, num_requests=args.num_requests, rate=rate,
                  time_scale=args.time_scale, length_scale=args.length_scale,
                  min_tokens=min(args.min_tokens, max_tokens), max_tokens=max_tokens, slo=workload_slo(args),
                  seed=args.seed, with_prompts=with_prompts, vocab_size=vocab_size)
    if prompts:
        return PromptWorkload(**common, prompts=prompts)
    return Workload(**common)


@dataclass(frozen=True)
class _InOrder:
    """ShareGPT: the prompts' own lengths, in order (not resampled)."""
    lengths: tuple[int, ...]

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return np.resize(np.asarray(self.lengths, dtype=np.int64), n)


def _positive(x: float, flag: str) -> float:
    if not x > 0:
        raise ValueError(f"{flag} must be > 0, got {x}")
    return x
