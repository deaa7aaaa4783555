"""What the model is (helpers.workloads.embedding.model.model_identity): its folder, revision and
a digest of the files sentence-transformers reads, which an output records and a resume
compares."""
import json
import os
import shutil

import pytest

from helpers import EmbeddingWorkload, OutputError, read_output, run_pipeline
from helpers.engine.contract.fingerprint import differences, encode
from helpers.workloads.embedding.model import default_model_path, model_identity


def _linked_copy(folder, cls: bool = False):
    """The embedded MiniLM at ``folder``: every file a link to the package's, its pooling CLS
    instead of mean where ``cls``."""
    shutil.copytree(default_model_path(), folder, copy_function=os.symlink)
    if cls:
        pooling = folder / "1_Pooling" / "config.json"
        config = json.loads(pooling.read_text())
        pooling.unlink()
        pooling.write_text(json.dumps({**config, "pooling_mode_cls_token": True,
                                       "pooling_mode_mean_tokens": False}))
    return folder


def test_the_identity_is_the_files_not_the_name(tmp_path):
    mean = model_identity(str(_linked_copy(tmp_path / "a" / "minilm")))
    cls = model_identity(str(_linked_copy(tmp_path / "b" / "minilm", cls=True)))
    default = model_identity(None)
    assert mean["model_digest"] == default["model_digest"]  # the same files, elsewhere
    assert mean["model_path"] != default["model_path"]
    assert cls["model_digest"] != mean["model_digest"]  # one module's configuration apart
    assert mean["model_revision"] is None  # (a folder; a hub snapshot names its commit)
    (tmp_path / "a" / "minilm" / "README.md").write_text("notes")  # decides nothing
    assert model_identity(str(tmp_path / "a" / "minilm")) == mean
    assert model_identity("no-such/model-anywhere") == {
        "model_path": None, "model_revision": None, "model_digest": None}


def test_a_hub_model_is_known_by_its_cached_snapshot_s_commit(tmp_path, monkeypatch):
    snapshot = tmp_path / "hub" / "models--org--m" / "snapshots" / "0123abcd"
    _linked_copy(snapshot)
    import huggingface_hub

    asked = []

    def snapshot_download(name, local_files_only):
        asked.append((name, local_files_only))
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    found = model_identity("org/m")
    assert asked == [("org/m", True)]  # (never a download)
    assert found["model_revision"] == "0123abcd"
    assert found["model_digest"] == model_identity(None)["model_digest"]


def test_the_fingerprint_names_the_model_s_files_and_a_moved_folder_still_resumes(tmp_path):
    mean = EmbeddingWorkload(model=str(_linked_copy(tmp_path / "a" / "minilm"))).fingerprint()
    cls = EmbeddingWorkload(model=str(_linked_copy(tmp_path / "b" / "minilm", cls=True)))
    changed = differences(json.loads(encode(mean)), cls.fingerprint())
    assert "model_digest" in changed


def test_a_resume_with_another_model_under_the_same_name_is_refused(tmp_path, monkeypatch):
    """Issue 59: two folders ``minilm`` (one pooling CLS), a run started from one and resumed
    from the other gave 300 rows of one model and 100 of the other, exit 0: the output recorded
    only the name. It records the model's files' digest, and the resume is refused naming it,
    before anything is written; the same files in another folder resume."""
    _linked_copy(tmp_path / "a" / "minilm")
    _linked_copy(tmp_path / "b" / "minilm", cls=True)
    _linked_copy(tmp_path / "c" / "minilm")
    texts = [(i, f"text number {i}") for i in range(40)]
    out = tmp_path / "out.h5"
    options = dict(workunit_size=10, output=out, backend="thread", progress=False)
    monkeypatch.chdir(tmp_path / "a")
    run_pipeline(texts, EmbeddingWorkload(model="minilm"), ["cpu"], limit=20, **options)
    before = out.stat().st_mtime_ns
    monkeypatch.chdir(tmp_path / "b")
    with pytest.raises(OutputError, match=r"was made from another workload: .*model_digest "
                                          r"'[0-9a-f]{16}' -> '[0-9a-f]{16}'"):
        run_pipeline(texts, EmbeddingWorkload(model="minilm"), ["cpu"], resume=True, **options)
    assert out.stat().st_mtime_ns == before
    monkeypatch.chdir(tmp_path / "c")  # the same files, another folder: a moved model
    run_pipeline(texts, EmbeddingWorkload(model="minilm"), ["cpu"], resume=True, **options)
    assert read_output(out)["ids"].tolist() == list(range(40))


def test_weights_in_a_format_that_does_not_load_change_nothing(tmp_path):
    """A later download of the same revision may add pytorch_model.bin beside
    model.safetensors: transformers still loads the safetensors, and the digest is the same."""
    folder = _linked_copy(tmp_path / "m")
    before = model_identity(str(folder))
    (folder / "pytorch_model.bin").write_bytes(b"other weights")
    assert model_identity(str(folder)) == before


def test_a_resume_names_the_model_otherwise_but_with_the_same_files(tmp_path, caplog):
    """An absolute path to a moved folder, a hub commit that touched no file the model loads:
    the model's name and revision differ, its digest does not: the resume goes on, saying so."""
    from helpers.engine.outputs.ownership import _check_same_job
    import h5py

    recorded = EmbeddingWorkload(model=str(_linked_copy(tmp_path / "a" / "m"))).fingerprint()
    moved = EmbeddingWorkload(model=str(_linked_copy(tmp_path / "b" / "m"))).fingerprint()
    other = EmbeddingWorkload(model=str(_linked_copy(tmp_path / "c" / "m", cls=True)))
    out = tmp_path / "out.h5"
    with h5py.File(out, "w") as f:
        f.attrs["input_fingerprint"] = encode({"source": "x"})
        f.attrs["workload_fingerprint"] = encode(recorded)
    _check_same_job(out, tmp_path, {"workload_fingerprint": moved})
    assert "named otherwise" in caplog.text
    with pytest.raises(OutputError, match="model_digest"):
        _check_same_job(out, tmp_path, {"workload_fingerprint": other.fingerprint()})
