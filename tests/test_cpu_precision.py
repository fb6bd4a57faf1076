"""CPU precision: bf16 where the CPU multiplies it natively, fp32 elsewhere, for SFT and inference.
(A bf16 SFT run itself is tested in `test_training_sft_train.py`.)"""

from __future__ import annotations

import pytest

import core.cpu_precision as cpu_precision
from core.training_settings import SFTSettings
from training.sft import _precision


@pytest.mark.parametrize("native, expected_training, expected_inference", [(True, "bf16", "bfloat16"), (False, "fp32", "float32")])
def test_the_cpu_default_follows_native_bf16_support(monkeypatch, native, expected_training, expected_inference):
    monkeypatch.setattr(cpu_precision, "cpu_has_native_bf16", lambda: native)
    monkeypatch.delenv("SEARCHSMITH_CPU_DTYPE", raising=False)
    assert cpu_precision.cpu_training_precision() == expected_training
    assert cpu_precision.cpu_inference_dtype() == expected_inference
    assert _precision(SFTSettings(), "cpu") == expected_training


def test_an_explicit_precision_wins_and_fp16_on_cpu_is_refused(monkeypatch):
    monkeypatch.setattr(cpu_precision, "cpu_has_native_bf16", lambda: True)
    assert _precision(SFTSettings(precision="fp32"), "cpu") == "fp32"
    assert _precision(SFTSettings(precision="bf16"), "cpu") == "bf16"
    with pytest.raises(ValueError, match="sft.precision fp16 needs a CUDA device"):
        _precision(SFTSettings(precision="fp16"), "cpu")
    monkeypatch.setenv("SEARCHSMITH_CPU_DTYPE", "float32")
    assert cpu_precision.cpu_inference_dtype() == "float32"


def test_encoders_compute_batches_in_bf16_where_it_is_native_and_single_texts_in_fp32(monkeypatch):
    """The index's embedder under `encoder_autocast`: forced on (as a native-bf16 CPU has it) a
    batch moves by bf16 rounding only; a single text, and everything under fp32, is the fp32 model's."""
    import numpy as np

    from search.embeddings import Embedder

    texts = ["Which team won the first FA Cup Final, played at Kennington Oval in 1872?",
             "The Wanderers beat the Royal Engineers 1-0 in the 1872 FA Cup Final at Kennington Oval.",
             "Kennington Oval is a cricket ground in Kennington, in the London Borough of Lambeth."]
    embedder = Embedder(backend="torch")
    monkeypatch.setenv("SEARCHSMITH_CPU_DTYPE", "float32")
    exact = embedder.encode(texts)
    single = embedder.encode(texts[:1])
    monkeypatch.setenv("SEARCHSMITH_CPU_DTYPE", "bfloat16")
    batched = embedder.encode(texts)
    assert batched.dtype == np.float32 and batched.shape == exact.shape
    assert 0 < np.abs(batched - exact).max() < 5e-3  # computed in bf16, and close
    assert (batched * exact).sum(axis=1).min() > 0.999  # unit vectors pointing the same way
    assert np.array_equal(embedder.encode(texts[:1]), single)  # one text: fp32 (no faster in bf16)
    assert [int(i) for i in np.argsort(-(batched[1:] @ batched[0]))] == [int(i) for i in np.argsort(-(exact[1:] @ exact[0]))]
