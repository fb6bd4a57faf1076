import polars as pl
import pytest

from core.storage import ArtifactNotFound, LocalArtifactStore


def test_local_store_round_trip_and_atomic_write(tmp_path):
    store = LocalArtifactStore(tmp_path)
    frame = pl.DataFrame({"a": [1, 2], "b": ["x", "y"]})
    store.write_parquet("acme/corpus/t.parquet", frame)
    assert store.read_parquet("acme/corpus/t.parquet").equals(frame)
    assert list(store.list("acme/")) == ["acme/corpus/t.parquet"]
    assert not list((tmp_path / "acme" / "corpus").glob("*.tmp"))
    with pytest.raises(ArtifactNotFound):
        store.read_bytes("acme/missing")


def test_failed_write_leaves_previous_artifact(tmp_path, monkeypatch):
    store = LocalArtifactStore(tmp_path)
    store.write_text("acme/x.txt", "old")

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("os.replace", crash)
    with pytest.raises(OSError):
        store.write_text("acme/x.txt", "new")
    assert store.read_text("acme/x.txt") == "old"
    assert not list((tmp_path / "acme").glob("*.tmp"))


@pytest.mark.parametrize("key", ["/abs", "../up", "a/../../b", ""])
def test_keys_must_stay_inside(tmp_path, key):
    with pytest.raises(ValueError):
        LocalArtifactStore(tmp_path).write_text(key, "x")
