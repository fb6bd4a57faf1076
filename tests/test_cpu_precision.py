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
