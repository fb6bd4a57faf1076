"""Resync-driven retraining: the share rule, and the sensor that turns qualifying resyncs into
one `customer_finetune` run each (stable run keys, an advancing cursor)."""

from __future__ import annotations

import dagster as dg
import pytest

from corpus.retrain_trigger import retrain_decision
from orchestration.automation import corpus_change_sensor


@pytest.mark.parametrize(
    ("counts", "threshold", "retrain"),
    [
        ({"added": 0, "changed": 0, "deleted": 0, "documents": 100}, 0.2, False),
        ({"added": 5, "changed": 10, "deleted": 0, "documents": 105}, 0.2, False),  # 15 of 100
        ({"added": 5, "changed": 10, "deleted": 10, "documents": 95}, 0.2, True),  # 25 of 100
        ({"added": 40, "changed": 0, "deleted": 0, "documents": 40}, 0.2, True),  # first sync
        ({"added": 0, "changed": 20, "deleted": 0, "documents": 100}, 0.2, False),  # exactly the share: not above
    ],
)
def test_retrain_when_the_changed_share_is_above_the_threshold(counts, threshold, retrain):
    decision = retrain_decision(counts, threshold)
    assert decision.retrain is retrain and decision.reason


def test_the_share_is_measured_against_the_corpus_before_the_sync():
    decision = retrain_decision({"added": 0, "changed": 0, "deleted": 50, "documents": 50}, 0.2)
    assert decision.changed_share == pytest.approx(0.5)


def _sync(instance: dg.DagsterInstance, customer: str, **counts: int) -> None:
    instance.report_runless_asset_event(dg.AssetMaterialization(asset_key="raw_documents", partition=customer, metadata=counts))


def test_the_sensor_requests_one_finetune_per_qualifying_resync_with_stable_run_keys():
    with dg.instance_for_test() as instance:
        _sync(instance, "demo", added=10, changed=0, deleted=0, documents=1000)  # 1%: no
        _sync(instance, "demo", added=0, changed=500, deleted=0, documents=1000)  # 50%: yes
        _sync(instance, "no-such-customer", added=5, changed=0, deleted=0, documents=5)  # not a customer file
        first = corpus_change_sensor(dg.build_sensor_context(instance=instance))
        assert [r.partition_key for r in first.run_requests] == ["demo"]
        request = first.run_requests[0]
        assert request.run_key.startswith("retrain:demo:") and request.tags["customer"] == "demo"
        replay = corpus_change_sensor(dg.build_sensor_context(instance=instance))
        assert [r.run_key for r in replay.run_requests] == [request.run_key], "same event, same run key: never launched twice"
        after = corpus_change_sensor(dg.build_sensor_context(instance=instance, cursor=first.cursor))
        assert after.run_requests == [] and after.skip_reason
        _sync(instance, "demo", added=0, changed=0, deleted=600, documents=400)
        later = corpus_change_sensor(dg.build_sensor_context(instance=instance, cursor=first.cursor))
        assert len(later.run_requests) == 1 and later.run_requests[0].run_key != request.run_key
