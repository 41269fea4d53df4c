"""``semrl`` commands run as forks of a process that has already imported the training stack.

A fresh ``python -m semrl train`` spends about 9 s importing torch and transformers on this
machine before it reads its config, and ``--num-processes 2`` adds accelerate's launcher (about
3 s) in front of two such processes: most of a multi-process test's time. A *preloaded server*
imports them once per test worker; each command is then ``os.fork()``-ed from it. Every command
still runs in processes of its own (own pid, memory, gloo process group, signals, exit status),
through ``semrl.cli.main`` as ``python -m semrl`` runs it.

``--num-processes N`` starts N ranks with the environment ``accelerate launch`` gives its
processes (torchrun's ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT`` ... and accelerate's
``ACCELERATE_*``), in one process group, and ends as torchrun's agent does: when one rank fails,
the others get SIGTERM, then SIGKILL after 30 s. ``tests/core/test_forked.py`` checks that
environment against a real ``accelerate launch``; ``test_two_processes_train_like_one`` keeps the
real launch. A command whose import-time variables (``OMP_NUM_THREADS``, ``HF_*`` ...) differ from
those the server imported with runs in a server of its own, started with them. A command with
``rollout.engine=vllm`` forks from a server that has imported vLLM as well, and compiled the one
function vLLM's sampler compiles even when eager, which each rank would otherwise compile again.
The server also loads the tokenizer of a command's ``model.name=`` directory before it forks
(``_load_tokenizer``): the fork finds it as a second load in one process finds it.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# What the preloaded server imports: everything `semrl train` imports before its first step.
# The tests' models are Llamas (tests/helpers.py), whose modeling module loads with the first model.
PRELOADED = (
    "semrl.cli",
    "semrl.cli.train",
    "semrl.runtime.trainer",
    "accelerate",
    "safetensors.torch",
    "transformers.models.llama.modeling_llama",
)
# What a vLLM engine imports as it starts, beyond `import vllm` (its CPU worker), which each fork
# would import again.
PRELOADED_VLLM = ("vllm.v1.worker.cpu_worker", "vllm.v1.worker.cpu_model_runner")
# A command with rollout.engine=vllm goes to a server that has also imported vLLM as semrl's engine
# does (about 7 s a rank here); the others to one that has not, since a fresh hf run never imports it.
VLLM_ARG = "rollout.engine=vllm"

# Variables that torch, transformers and their kin read once, at import: a command whose values differ
# from a running server's gets a server started with them (preloaded_server).
_READ_AT_IMPORT = (
    "OMP_",
    "MKL_",
    "TORCH",
    "PYTORCH_",
    "HF_",
    "TRANSFORMERS_",
    "TOKENIZERS_",
    "CUDA_",
    "VLLM_",
)


def read_at_import(env: dict[str, str]) -> dict[str, str]:
    """The variables of ``env`` that an import may read once (``_READ_AT_IMPORT``)."""
    return {k: v for k, v in env.items() if k.startswith(_READ_AT_IMPORT)}


# torchrun's and accelerate's variables for each rank, as the launch of `semrl train --num-processes
# N` (semrl.cli.train.accelerate_launch) sets them; the rank's own go below.
# accelerate's own ACCELERATE_* variables come from accelerate_env(): their set changes between
# accelerate's releases (1.16 sets ACCELERATE_DYNAMO_USE_DYNAMIC only when it is given).
LAUNCH_ENV = {
    "GROUP_RANK": "0",
    "GROUP_WORLD_SIZE": "1",
    "MASTER_ADDR": "127.0.0.1",
    "ROLE_NAME": "default",
    "TORCHELASTIC_MAX_RESTARTS": "0",
    "TORCHELASTIC_RESTART_COUNT": "0",
    "TORCHELASTIC_RUN_ID": "none",
    "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    # torchrun's agent holds the rendezvous store; here rank 0 does, as torch's env:// rendezvous
    "TORCHELASTIC_USE_AGENT_STORE": "False",
}
# what a real launch may set and a fork does not: torchrun's per-rank error file (nothing here
# reads it) and a terminal size (the launcher, started from pytest, adds COLUMNS and LINES)
UNSET_BY_FORK = ("TORCHELASTIC_ERROR_FILE", "COLUMNS", "LINES")
_GRACE_S = 30.0


@functools.cache
def accelerate_env() -> dict[str, str]:
    """The ``ACCELERATE_*`` variables that the installed accelerate's launcher gives each process of
    ``semrl.cli.train.accelerate_launch``, from accelerate's own parser and environment builder."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    from semrl.cli.train import accelerate_launch

    launch_args = accelerate_launch(2, "0")[3:]  # after `python -m accelerate.commands.launch`
    args, _, _ = _validate_launch_command(launch_command_parser().parse_args([*launch_args, "x.py"]))
    return {k: v for k, v in prepare_multi_gpu_env(args).items() if k.startswith("ACCELERATE_")}


def rank_env(rank: int, world: int, port: int) -> dict[str, str]:
    """The launch variables of ``rank`` of ``world`` processes on one machine."""
    return {
        **LAUNCH_ENV,
        **accelerate_env(),
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "ROLE_RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(world),
        "ROLE_WORLD_SIZE": str(world),
        "MASTER_PORT": str(port),
    }


class PreloadedServer:
    """The client side: one server process per test worker and flavour ("hf", or "vllm": vLLM
    imported too), started on first use."""

    def __init__(self, flavour: str = "hf") -> None:
        self.flavour = flavour
        self._proc: subprocess.Popen[bytes] | None = None
        atexit.register(self.close)

    def _server(self, env: dict[str, str]) -> subprocess.Popen[bytes]:
        """The server, started with ``env`` (``preloaded_server`` keeps one per set of import-time
        variables, and the server refuses a command with others), or again if it ended."""
        if self._proc is not None and self._proc.poll() is not None:
            self.close()
        if self._proc is None:
            root = Path(__file__).resolve().parents[1]
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "tests.forked", self.flavour],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                cwd=root,
                env={**env, "PYTHONPATH": os.pathsep.join([str(root), env.get("PYTHONPATH", "")])},
                start_new_session=True,  # a command's Ctrl-C or SIGTERM to its group never reaches it
            )
        return self._proc

    @property
    def pid(self) -> int | None:
        """The running server's process id (None before the first command)."""
        return None if self._proc is None else self._proc.pid

    def run(
        self,
        args: list[str],
        env: dict[str, str] | None = None,
        timeout: float = 600.0,
        code: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """``python -m semrl *args`` (``--num-processes N``: N ranks) with ``env`` (default: this
        process's), in the current directory; what ``subprocess.run(..., capture_output=True,
        text=True)`` would return. A run past ``timeout`` is killed and raises TimeoutExpired. With
        ``code``: ``python -c code *args`` instead, in one process."""
        env = dict(os.environ if env is None else env)
        server = self._server(env)
        assert server.stdin is not None and server.stdout is not None
        with tempfile.TemporaryDirectory(prefix="semrl-forked-") as tmp:
            out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
            request = {
                "code": code,
                "args": list(args),
                "env": env,
                "cwd": os.getcwd(),
                "stdout": str(out),
                "stderr": str(err),
                "timeout": timeout,
            }
            server.stdin.write((json.dumps(request) + "\n").encode())
            server.stdin.flush()
            line = server.stdout.readline()
            if not line:
                raise RuntimeError(
                    f"the preloaded server ended (exit {server.wait()}); its stderr is the test's"
                )
            reply = json.loads(line)
            if "refused" in reply:
                raise ValueError(reply["refused"])
            stdout = out.read_text() if out.exists() else ""
            stderr = err.read_text() if err.exists() else ""
        command = [sys.executable, *(["-c", code] if code is not None else ["-m", "semrl"]), *args]
        if reply["timed_out"]:
            raise subprocess.TimeoutExpired(command, timeout, stdout, stderr)
        return subprocess.CompletedProcess(command, reply["returncode"], stdout, stderr)

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        self._proc = None


_SERVERS: dict[tuple[str, tuple[tuple[str, str], ...]], PreloadedServer] = {}
FORKS_ASKED = {"hf": 0, "vllm": 0}  # commands forked from each flavour's servers (tests/conftest.py reads it)


def preloaded_server(flavour: str = "hf", env: dict[str, str] | None = None) -> PreloadedServer:
    """This test worker's server of ``flavour`` for the import-time variables of ``env`` (default:
    this process's): one per set, so that a command with other values (OMP_NUM_THREADS=2, say) does
    not make the next command's server start again."""
    variables = read_at_import(dict(os.environ if env is None else env))
    key = (flavour, tuple(sorted(variables.items())))
    if key not in _SERVERS:
        _SERVERS[key] = PreloadedServer(flavour)
    return _SERVERS[key]


def run_semrl(
    *args: str, env: dict[str, str] | None = None, timeout: float = 600.0
) -> subprocess.CompletedProcess[str]:
    """``python -m semrl *args`` as a fork of this test worker's preloaded server (module docstring):
    the vLLM one for a command with ``rollout.engine=vllm``."""
    flavour = "vllm" if VLLM_ARG in args else "hf"
    FORKS_ASKED[flavour] += 1
    return preloaded_server(flavour, env).run(list(args), env, timeout)


def run_python(
    code: str, *args: str, flavour: str = "hf", env: dict[str, str] | None = None, timeout: float = 600.0
) -> subprocess.CompletedProcess[str]:
    """``python -c code *args`` as a fork of this test worker's ``flavour`` server: a script that
    drives semrl's parts itself (an engine, a process group) in a process of its own."""
    FORKS_ASKED[flavour] += 1
    return preloaded_server(flavour, env).run(list(args), env, timeout, code=code)


# ---- the server side: runs in `python -m tests.forked`, never in the test process ----


_STARTED_WITH = dict(os.environ)  # the server's environment before its imports


def _refusal(env: dict[str, str]) -> str | None:
    """Why a command with ``env`` cannot run as a fork of this server, or None (the client starts a
    server for each set of import-time variables, so this only guards that promise)."""
    asked, imported = read_at_import(env), read_at_import(_STARTED_WITH)
    if asked == imported:
        return None
    return (
        f"import-time variables {sorted(set(asked.items()) ^ set(imported.items()))} differ from the "
        "preloaded server's, and torch or transformers read them at import"
    )


def _set_by_imports() -> dict[str, str]:
    """What the server's imports put into its environment (torch sets TORCHINDUCTOR_CACHE_DIR): a
    fresh process's imports would put the same into its own."""
    return {k: v for k, v in os.environ.items() if _STARTED_WITH.get(k) != v}


def _rank_process(
    args: list[str], env: dict[str, str], cwd: str, stdout: int, stderr: int, group: int, code: str | None
) -> None:
    """In the forked child: become ``python -m semrl *args`` (or ``python -c code *args``) and exit
    with its status."""
    import atexit as child_atexit
    import random
    import traceback

    status: int = 1
    try:
        os.setpgid(0, group)
        os.dup2(stdout, 1)
        os.dup2(stderr, 2)
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        for number in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGCHLD):
            signal.signal(number, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        random.seed()  # a new process's generators are not the server's
        import numpy

        numpy.random.seed(int.from_bytes(os.urandom(4), "little"))
        # `python -m semrl`'s (or `python -c`'s) main module and argv: multiprocessing's fork server
        # and spawn (the reward workers) read the one, and nothing is imported from the server's own module
        import importlib.util
        import types

        if code is not None:  # `python -c`: a __main__ without a file, argv[0] "-c"
            script = types.ModuleType("__main__")
            sys.modules["__main__"] = script
            sys.argv = ["-c", *args]
            exec(compile(code, "<string>", "exec"), script.__dict__)
            status = 0
        else:
            spec = importlib.util.find_spec("semrl.__main__")
            assert spec is not None and spec.origin is not None
            entry = types.ModuleType("__main__")
            entry.__spec__, entry.__file__ = spec, spec.origin
            sys.modules["__main__"] = entry
            sys.argv = [spec.origin, *args]
            from semrl.cli import main

            status = int(main(args) or 0)
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            status = stop.code or 0
        else:  # sys.exit("message"), as Python ends it
            print(stop.code, file=sys.stderr)
            status = 1
    except KeyboardInterrupt:
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        child_atexit._run_exitfuncs()
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # end as Python does on an uncaught Ctrl-C
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:
        traceback.print_exc()
        status = 1
    finally:
        try:
            child_atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(status)


def _load_tokenizer(args: list[str]) -> None:
    """Load the tokenizer of the ``model.name=`` directory in ``args`` into semrl's per-process cache
    (``semrl.models.loading.load_tokenizer``, keyed by the directory and its files), once per server:
    each fork then skips the 0.45 s load, as a second load in one process does. A directory that
    does not load is left to the command, which reports it."""
    from semrl.models.loading import load_tokenizer

    for arg in args:
        name = arg.removeprefix("model.name=")
        if name != arg and Path(name).is_dir():
            try:
                load_tokenizer(name)
            except Exception:  # noqa: BLE001, S110 - the command reports what is wrong with it
                pass


def _launch(request: dict[str, Any]) -> dict[str, Any]:
    """Fork the ranks of one command and wait for them as torchrun's agent does."""
    args: list[str] = request["args"]
    env: dict[str, str] = request["env"]
    refusal = _refusal(env)
    if refusal:
        return {"refused": refusal}
    _load_tokenizer(args)
    world = 1
    if "--num-processes" in args:
        at = args.index("--num-processes")
        world = int(args[at + 1])
        args = args[:at] + args[at + 2 :]
    from semrl.cli.train import free_port

    port = free_port()
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
    stdout, stderr = os.open(request["stdout"], flags, 0o644), os.open(request["stderr"], flags, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    env = {**env, **_set_by_imports()}
    pids: list[int] = []
    for rank in range(world):
        rank_vars = rank_env(rank, world, port) if world > 1 else {}
        pid = os.fork()
        if pid == 0:
            _rank_process(
                args,
                {**env, **rank_vars},
                request["cwd"],
                stdout,
                stderr,
                pids[0] if pids else 0,
                request.get("code"),
            )
        if not pids:
            try:  # the group exists before the next rank joins it, whichever process runs first
                os.setpgid(pid, pid)
            except OSError:
                pass
        pids.append(pid)
    os.close(stdout)
    os.close(stderr)
    codes: dict[int, int] = {}
    deadline = time.monotonic() + float(request["timeout"])
    stop_at: float | None = None
    timed_out = False
    while len(codes) < world:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid:
            codes[pid] = os.waitstatus_to_exitcode(status)
            if codes[pid] != 0 and stop_at is None:  # torchrun: one failed rank stops the others
                stop_at = time.monotonic() + _GRACE_S
                _signal_all(pids, codes, signal.SIGTERM)
            continue
        now = time.monotonic()
        if now > deadline and not timed_out:
            timed_out = True
            _signal_all(pids, codes, signal.SIGKILL)
        elif stop_at is not None and now > stop_at:
            _signal_all(pids, codes, signal.SIGKILL)
        time.sleep(0.02)
    if world == 1:
        returncode = codes[pids[0]]
    else:  # accelerate's launcher exits 1 when a rank failed
        returncode = 0 if all(code == 0 for code in codes.values()) else 1
    return {"returncode": returncode, "timed_out": timed_out}


def _signal_all(pids: list[int], done: dict[int, int], number: int) -> None:
    for pid in pids:
        if pid not in done:
            try:
                os.kill(pid, number)
            except ProcessLookupError:
                pass


def _compile_vllm_sampler(vocab_size: int = 49152) -> None:
    """Compile vLLM's one torch.compile'd sampler function (the rank of each sampled token's
    log-prob; compiled even under enforce_eager) for the tiny models' vocabulary, as every rank's
    first sampling step does: about 1.6 s a rank here (8 s with inductor's disk cache cold), which
    each fork then finds compiled. A vocabulary of another size compiles again in the fork, as it
    would anyway."""
    import torch
    from tqdm import tqdm
    from vllm.v1.sample.ops.logprobs import batched_count_greater_than

    logprobs = torch.randn(3, vocab_size)
    sampled = logprobs[:, :1].clone()
    for tensor in (logprobs, sampled):  # as vLLM's Sampler.gather_logprobs marks them
        torch._dynamo.decorators.mark_unbacked(tensor, 0)
    # in this thread: with a cold disk cache inductor compiles C++ in a thread pool that would stay
    with torch._inductor.config.patch(compile_threads=1):
        batched_count_greater_than(logprobs, sampled)
    if tqdm.monitor is not None:  # the compile's progress bar started tqdm's monitor thread
        tqdm.monitor.exit()
        tqdm.monitor = None


def serve(flavour: str) -> None:
    """Import PRELOADED (and vLLM for the "vllm" flavour), then run one request (a JSON line on
    stdin) at a time, replying on stdout."""
    import importlib
    import threading

    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # what an import prints goes to stderr, never into a reply
    from semrl.core.collector import imports_collected_once

    # What the imports keep, frozen: a fork's full collections then walk only the objects of its own
    # command (docs/benchmarks.md, "The collector's share")
    with imports_collected_once():
        for name in PRELOADED:
            importlib.import_module(name)
        if flavour == "vllm":
            from semrl.rollout.engines.vllm.start import import_vllm

            vllm = import_vllm()  # as the engine imports it, with the variables it sets first
            vllm.LLM, vllm.SamplingParams, vllm.TokensPrompt  # noqa: B018  (lazy: each imports its modules)
            for name in PRELOADED_VLLM:
                importlib.import_module(name)
            _compile_vllm_sampler()
    # a fork copies only the calling thread: a thread started by an import would be lost in the
    # children while holding whatever lock it held
    assert threading.active_count() == 1, [t.name for t in threading.enumerate()]
    for line in sys.stdin:
        reply = _launch(json.loads(line))
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


if __name__ == "__main__":
    serve(sys.argv[1])
