"""The attention kernel choices per device compute the same numbers (issue 26 point 6): MLA's V padded
to the q/k head dim (CPU) or not (GPU), and continued GQA chunks with expanded K/V (GPU) or enable_gqa
with a mask (CPU). Both variants run here on the CPU by flipping the per-device switches."""
import pytest
import torch

import asap.model.attention as attention


@pytest.mark.parametrize("start", [0, 48])
def test_unpadded_mla_values_equal_padded(start, monkeypatch):
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(4, 16, 24, generator=g), torch.randn(4, start + 16, 24, generator=g)
    v = torch.randn(4, start + 16, 16, generator=g)
    padded = attention._sdpa(q, k, v, start, 0.2)
    monkeypatch.setattr(attention, "PAD_V_ON", set())
    plain = attention._sdpa(q, k, v, start, 0.2)
    assert plain.shape == padded.shape == (16, 4, 16)
    assert torch.allclose(plain, padded, atol=1e-6)


def test_continued_gqa_chunk_with_expanded_kv_equals_enable_gqa(monkeypatch):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(8, 16, 32, generator=g)
    k, v = torch.randn(2, 80, 32, generator=g), torch.randn(2, 80, 32, generator=g)
    masked = attention._sdpa(q, k, v, 64, 0.2, gqa=True)
    monkeypatch.setattr(attention, "EXPAND_GQA_ON", {"cpu"})
    expanded = attention._sdpa(q, k, v, 64, 0.2, gqa=True)
    assert torch.allclose(expanded, masked, atol=1e-6)
    # and both are causal attention of the chunk placed after 64 cached keys
    full_q = torch.cat([torch.zeros(8, 64, 32), q], 1)
    ref = torch.nn.functional.scaled_dot_product_attention(full_q[None], k.repeat_interleave(4, 0)[None],
                                                           v.repeat_interleave(4, 0)[None], is_causal=True,
                                                           scale=0.2)[0, :, 64:].transpose(0, 1)
    assert torch.allclose(expanded, ref, atol=1e-5)
