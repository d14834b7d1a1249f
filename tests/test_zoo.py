"""The model zoo (models/zoo/): the models people deploy, each built from its config with random
weights. On the CPU every one must capture, plan, code and compile (nvcc, sm_90); the captures
and builds run as background commands from the start of the session (tests/ahead.py), a few
models per process, and each model's test reads its record. Verification and speed need a GPU:
``stitchcuda bench models/zoo`` (BENCHMARKS.md)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests import ahead

REPO = Path(__file__).resolve().parents[1]
ZOO = REPO / "models" / "zoo"
MODELS = sorted(p.stem for p in ZOO.glob("*.py"))
POLICY = "tf32"
#: Background processes the zoo is split over (each imports torch and transformers once).
PIECES = 3

#: model -> family: what the zoo must span (the issue's list: convolutional nets, vision
#: transformers, a segmentation net, encoders, decoders, speech).
FAMILIES = {
    "resnet18": "ResNet", "resnet50": "ResNet", "convnext_tiny": "ConvNeXt", "swin_tiny": "Swin",
    "vit_base": "ViT", "deit_small": "DeiT", "dinov2_small": "DINOv2", "mobilenet_v1": "MobileNet",
    "mobilenet_v2": "MobileNet", "efficientnet_b0": "EfficientNet", "regnet_y_400mf": "RegNet",
    "segformer_b0": "SegFormer", "unet": "UNet", "clip_vision": "CLIP", "clip_text": "CLIP",
    "bert_base": "BERT", "distilbert": "DistilBERT", "roberta_base": "RoBERTa", "electra_small": "ELECTRA",
    "t5_encoder": "T5", "gpt2": "GPT-2", "llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2",
    "whisper_encoder": "Whisper",
}


def ahead_commands(out_dir: Path) -> dict[str, list[str]]:
    if importlib.util.find_spec("transformers") is None:
        return {}
    pieces = [MODELS[i::PIECES] for i in range(PIECES)]
    return {f"zoo-{i}": [sys.executable, str(REPO / "tests" / "zoo_check.py"), str(out_dir / f"zoo-{i}.json"), POLICY,
                         str(out_dir / "cache"), *[str(ZOO / f"{m}.py") for m in piece]]
            for i, piece in enumerate(pieces) if piece}


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> dict[str, dict]:
    pytest.importorskip("transformers")
    done = ahead.results(sys.modules[__name__], tmp_path_factory.mktemp("zoo"))
    failed = {k: d.output[-3000:] for k, d in done.items() if d.returncode != 0}
    assert not failed, f"zoo processes failed: {failed}"
    recs = [r for k, d in done.items() for r in json.loads((d.out / f"{k}.json").read_text())]
    print("\n" + "\n".join(f"  {r['model']:16} {r['stage']:9} {r.get('tasks', '-'):>4} tasks  "
                           f"plan {r.get('plan_s', '-')} s  nvcc {r.get('build_s', '-')} s" for r in recs))
    return {r["model"]: r for r in recs}


def test_the_zoo_spans_the_families():
    assert sorted(FAMILIES) == MODELS, "every zoo model has its family here, and every family entry a model"
    assert len(MODELS) >= 24 and len(set(FAMILIES.values())) >= 14, Counter(FAMILIES.values())
    for m in MODELS:
        text = (ZOO / f"{m}.py").read_text()
        assert text.startswith('"""') and "def get_inputs" in text and "def get_init_inputs" in text, m
        assert "from_pretrained" not in text, f"{m}: the zoo downloads nothing"


@pytest.mark.parametrize("model", MODELS)
def test_zoo_model_compiles(records, model):
    r = records[model]
    assert r["stage"] in ("compiled", "coded"), f"{model} stopped at {r['stage']}: {r['error']}"
    if r["stage"] == "coded":
        pytest.skip("no nvcc: captured, planned and coded only")


def test_a_zoo_model_capture_failure_names_the_op_the_module_and_the_line():
    """An op stitchcuda had no implementation of, in a model of the zoo: the error names the op,
    the module it runs in and the source line (here in transformers' own code), as the README says."""
    pytest.importorskip("transformers")
    from stitchcuda import frontend, ops
    from stitchcuda.aten import UnsupportedOpError

    spec = importlib.util.spec_from_file_location("zoo_electra", ZOO / "electra_small.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.batch_size, mod.seq_len = 2, 16  # the error does not depend on the size
    without_gelu = {op for op in ops.supported() if "gelu" not in op}
    with pytest.raises(UnsupportedOpError) as e:
        frontend.capture(mod.Model(), mod.get_inputs(), "electra_small", supported_ops=without_gelu)
    lines = str(e.value).splitlines()
    first = lines[1]
    assert "aten.gelu.default" in first and "intermediate" in first, first
    assert re.search(r"\w+\.py line \d+: ", first), first
    # twelve layers reach the same line: one line of the message, the other eleven counted
    assert len(lines) == 2 and first.endswith("(and 11 more places reaching this line)"), lines
    assert len(e.value.ops) == 12
