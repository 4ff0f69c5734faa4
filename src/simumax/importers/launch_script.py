"""The Megatron arguments of a launch script, read as bash would hand them to
``pretrain_gpt.py``: comments and line continuations, ``NAME=value`` and
``NAME="..."`` strings spanning lines, bash arrays ``NAME=( ... )``, and ``$NAME``,
``${NAME}``, ``"${NAME[@]}"`` expanded from them (or from the environment given). Not a
shell: no command substitution, arithmetic or conditionals (their words pass through and
show up as ignored flags)."""

from __future__ import annotations

import re
import shlex

from simumax.errors import ConfigError

_ASSIGN = re.compile(r"^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:\[[@*]\])?(?::-([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def _tokens(text: str) -> list[str]:
    lex = shlex.shlex(text, posix=True)
    lex.whitespace_split = True
    lex.commenters = "#"
    try:
        return list(lex)
    except ValueError as exc:  # unbalanced quotes
        raise ConfigError("--file", f"cannot read the script ({exc})") from None


def _expand(word: str, env: dict[str, list[str]]) -> list[str]:
    """A word with its variables expanded; a word that is one variable becomes its words
    (an array, or a string split as bash splits an unquoted expansion)."""
    whole = _VAR.fullmatch(word)
    if whole:
        name = whole.group(1) or whole.group(3)
        if name in env:
            return list(env[name])
        default = whole.group(2)
        return _tokens(default) if default else []
    return [_VAR.sub(lambda m: " ".join(env.get(m.group(1) or m.group(3), [m.group(2) or ""])), word)]


def megatron_words(text: str, environ: dict[str, str] | None = None) -> list[str]:
    """Every word of the script's commands after expansion, from the first ``--`` flag on
    (the launcher and the script name before it are dropped)."""
    text = text.replace("\\\n", " ")
    env: dict[str, list[str]] = {k: _tokens(v) for k, v in (environ or {}).items()}
    words: list[str] = []
    toks = _tokens(text)
    i = 0
    while i < len(toks):
        tok = toks[i]
        m = _ASSIGN.match(tok)
        if m and not tok.startswith("-"):
            name, value = m.group(1), m.group(2)
            if value == "(" or value.startswith("("):  # an array: words up to the closing parenthesis
                items: list[str] = []
                rest = value[1:]
                if rest:
                    items.append(rest)
                i += 1
                while i < len(toks) and not toks[i].endswith(")"):
                    items.append(toks[i])
                    i += 1
                if i < len(toks) and toks[i] != ")":
                    items.append(toks[i][:-1])
                if items and items[-1].endswith(")"):
                    items[-1] = items[-1][:-1]
                env[name] = [w for item in items if item for w in _expand(item, env)]
            else:
                env[name] = [w for part in _tokens(value) for w in _expand(part, env)]
            i += 1
            continue
        words += _expand(tok, env)
        i += 1
    first = next((j for j, w in enumerate(words) if w.startswith("--")), None)
    return words[first:] if first is not None else []


# torchrun's (and torch.distributed.launch's) flags: the GPUs it starts and how it meets
LAUNCHER_FLAGS = frozenset({
    "--nproc-per-node", "--nproc_per_node", "--nnodes", "--node-rank", "--node_rank", "--master-addr", "--master_addr",
    "--master-port", "--master_port", "--rdzv-backend", "--rdzv_backend", "--rdzv-endpoint", "--rdzv_endpoint",
    "--rdzv-id", "--rdzv_id", "--max-restarts", "--max_restarts", "--standalone",
})


def launcher_world_size(words: list[str]) -> tuple[int | None, str | None]:
    """(GPUs, how they were read) that torchrun's flags start: --nproc-per-node x --nnodes
    (one node without --nnodes; an elastic MIN:MAX with MIN = MAX counts); (None, None)
    without --nproc-per-node or where a value is not a number (``gpu``, ``auto``, ``1:4``)."""
    values: dict[str, str] = {}
    for i, word in enumerate(words):
        flag, eq, inline = word.partition("=")
        if flag in ("--nproc-per-node", "--nproc_per_node", "--nnodes"):
            value = inline if eq else (words[i + 1] if i + 1 < len(words) else "")
            values[flag.replace("_", "-")] = value
    nproc = values.get("--nproc-per-node")
    nodes = values.get("--nnodes", "1")
    low, _, high = nodes.partition(":")
    if nproc is None or not nproc.isdigit() or not low.isdigit() or (high and high != low) or int(nproc) * int(low) < 1:
        return None, None
    return int(nproc) * int(low), f"--nproc-per-node {nproc} x --nnodes {nodes}"
