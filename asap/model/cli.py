"""`asap make-model PRESET DIR`: write a preset as an HF-format directory with seeded random weights."""
from __future__ import annotations


def register(sub):
    from asap.model.presets import PRESETS
    p = sub.add_parser("make-model", help="write a preset model (seeded random weights) as an HF directory",
                       description="Write a preset as an HF-format directory (config.json + safetensors) with "
                                   "seeded random weights; no download. Seconds for tiny-*, about 20 s for "
                                   "small-* on two cores. Models named by preset elsewhere are made on first use "
                                   "into $ASAP_CACHE (default ~/.cache/asap).")
    p.add_argument("preset", help=f"one of: {', '.join(PRESETS)}")
    p.add_argument("dir", help="directory to write")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    p.add_argument("--fp8", metavar="BOxBI", default=None,
                   help="write the linear weights as block-FP8 (float8_e4m3fn + weight_scale_inv) in blocks of "
                        "BOxBI, e.g. 128x128 as DeepSeek-V3 ships them")
    p.set_defaults(func=run)


def run(args):
    from asap.model.config import ModelConfig
    from asap.model.materialize import materialize
    block = None
    if args.fp8:
        try:
            block = tuple(int(b) for b in args.fp8.lower().split("x"))
            assert len(block) == 2 and min(block) > 0
        except (ValueError, AssertionError):
            raise SystemExit(f"--fp8 wants BOxBI, e.g. 128x128, got {args.fp8!r}") from None
    out = materialize(args.preset, args.dir, seed=args.seed, fp8_block=block)
    n = ModelConfig.from_dir(out).num_params()
    print(f"wrote {args.preset} to {out} ({n['total'] / 1e6:.1f}M parameters, "
          f"{n['experts'] / 1e6:.1f}M in routed experts)")
