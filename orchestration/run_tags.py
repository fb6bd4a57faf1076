"""Run tags that the production run queue limits by, and that place fine-tunes on GPU nodes.

The queued run coordinator (deploy/dagster.yaml, rendered by orchestration/instance.py) counts
runs by tag: `searchsmith/resync: <customer>` at most one per customer, `searchsmith/finetune:
<customer>` at most one per customer and at most one per accelerator across customers. The
customer is the run's partition, so the tags come from the job's partitioned config: every path
that launches a partitioned run gets them (a schedule, a sensor, the UI, a backfill, `dagster job
launch`), not only the ones that remember to set them.

`dagster-k8s/config` on the fine-tune jobs asks Kubernetes (K8sRunLauncher, deploy/helm) for a
GPU node for the run's pod; other launchers ignore it. Simplified: one run holds one node's
accelerators for its whole length (SFT, RL and the benchmark in one pod), which is what the
global limit counts.
"""

from __future__ import annotations

import json
import os

import dagster as dg

from assets.partitions import customers_partitions

RESYNC_TAG = "searchsmith/resync"
FINETUNE_TAG = "searchsmith/finetune"
K8S_CONFIG_TAG = "dagster-k8s/config"

# Which limit a job counts against; a job not named here is limited only by the global run limit.
JOB_LIMIT_TAGS = {
    "corpus_resync": RESYNC_TAG,
    "finetune_sft": FINETUNE_TAG,
    "finetune_rl": FINETUNE_TAG,
    "finetune_all": FINETUNE_TAG,
    "finetune_reranker": FINETUNE_TAG,
    "customer_finetune": FINETUNE_TAG,
    "customer_lineage": FINETUNE_TAG,
}


def limit_tags(job_name: str, customer: str) -> dict[str, str]:
    """The tags a run of `job_name` for `customer` is counted by in the run queue."""
    tag = JOB_LIMIT_TAGS.get(job_name)
    return {tag: customer} if tag else {}


def gpu_pod_config(gpus: int | None = None) -> dict:
    """The run pod of a fine-tune: `gpus` accelerators (default $SEARCHSMITH_FINETUNE_GPUS or 1),
    on nodes labelled for them, tolerating their taint."""
    gpus = gpus if gpus is not None else int(os.environ.get("SEARCHSMITH_FINETUNE_GPUS", "1"))
    return {
        "container_config": {
            "resources": {
                "requests": {"cpu": "4", "memory": "32Gi", "nvidia.com/gpu": str(gpus)},
                "limits": {"memory": "64Gi", "nvidia.com/gpu": str(gpus)},
            }
        },
        "pod_spec_config": {
            "node_selector": {"searchsmith/accelerator": "gpu"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
    }


def job_tags(job_name: str) -> dict[str, str]:
    """Static tags of a job: the GPU pod request for the jobs that fine-tune."""
    if JOB_LIMIT_TAGS.get(job_name) == FINETUNE_TAG:
        return {K8S_CONFIG_TAG: json.dumps(gpu_pod_config(), sort_keys=True)}
    return {}


def limits_config(job_name: str) -> dg.PartitionedConfig:
    """The job's partitioned config: no run config of its own, the customer's limit tags."""
    return dg.PartitionedConfig(
        partitions_def=customers_partitions,
        run_config_for_partition_key_fn=lambda _customer: {},
        tags_for_partition_key_fn=lambda customer: limit_tags(job_name, customer),
    )
