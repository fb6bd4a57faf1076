"""One sidecar file beside every adapter; adapters from before it was shared still read."""

from __future__ import annotations

import json

from agent.adapter_sidecar import SIDECAR, read_sidecar, sidecar_file, write_sidecar
from agent.policy_spec import PolicySpec
from training.rl_checkpoints import latest_checkpoint


def test_written_atomically_and_read_back(tmp_path):
    path = write_sidecar(tmp_path / "adapter", {"base_model": "smollm2", "harness_profile": {"view": "compact"}})
    assert path.name == SIDECAR and not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temp left behind
    assert read_sidecar(path.parent)["harness_profile"] == {"view": "compact"}
    assert read_sidecar(tmp_path / "nothing-here") == {} and sidecar_file(tmp_path) is None


def test_a_cispo_adapter_written_before_the_shared_name_still_serves_and_resumes(tmp_path):
    old = tmp_path / "cispo" / "checkpoints" / "step-000002"
    old.mkdir(parents=True)
    (old / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "/elsewhere/base"}))
    (old / "trainer_state.pt").write_bytes(b"state")
    (old / "checkpoint.json").write_text(json.dumps({"base_model": "smollm2", "config": {"group_size": 4}}))
    assert read_sidecar(old)["base_model"] == "smollm2"
    assert PolicySpec.parse(f"transformers:{old}").adapter().base_model == "smollm2"  # the sidecar wins over peft's path
    assert latest_checkpoint(tmp_path / "cispo") == old  # a run started before the upgrade resumes from it
