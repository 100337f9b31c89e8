"""Hardware profiles live in asap.cost.hardware; this module keeps the old import path."""
from asap.cost.hardware import (BUILTIN, OP_NAMES, PROFILE_DIR, SCHEMA, Hardware, Link, OpRate,  # noqa: F401
                                calibrated_cpu_path, cpu_profile_path, from_json, get_hardware, load_profile)
