"""`asap make-model PRESET DIR`: write a preset as an HF-format directory with seeded random weights."""
from __future__ import annotations


def register(sub):
    from asap.model.presets import PRESETS
    p = sub.add_parser("make-model", help="write a preset model (seeded random weights) as an HF directory")
    p.add_argument("preset", help=f"one of: {', '.join(PRESETS)}")
    p.add_argument("dir")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)


def run(args):
    from asap.config import ModelConfig
    from asap.model.materialize import materialize
    out = materialize(args.preset, args.dir, seed=args.seed)
    n = ModelConfig.from_dir(out).num_params()
    print(f"wrote {args.preset} to {out} ({n['total'] / 1e6:.1f}M parameters, "
          f"{n['experts'] / 1e6:.1f}M in routed experts)")
