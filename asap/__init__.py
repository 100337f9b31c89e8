"""ASAP: disaggregated, asynchronous prefill serving for Mixture-of-Experts LLMs."""
from asap.engine.llm import LLM
from asap.engine.output import PrefillOutput

__all__ = ["LLM", "PrefillOutput"]
__version__ = "0.1.0"
