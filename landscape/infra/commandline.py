"""What the command-line entry points (``landscape``, ``fl-run``) share.

Bounded JSON options and the last-resort error line.

JSON given on the command line (``--module-kwargs``, ``--partition-options``, ``--option KEY=JSON``)
is checked for size and nesting depth before it is parsed, so a hostile value is refused with
one clear line instead of exhausting the parser's recursion (Python's ``json`` recurses once per
nesting level).
"""
from __future__ import annotations

from typing import Any

from .errors import ConfigError
from .reading import load_json

#: Most characters of one JSON option (options are small objects such as ``{"alpha": 0.5}``).
MAX_JSON_CHARS = 65_536
#: Deepest nesting of arrays and objects in one JSON option.
MAX_JSON_DEPTH = 32
#: Longest exception message repeated in :func:`internal_error`.
MAX_MESSAGE_CHARS = 500


def json_depth(text: str) -> int:
    """The deepest nesting of ``[`` and ``{`` in JSON text (brackets inside strings do not count).

    Parameters
    ----------
    text : str
        JSON text (valid or not).

    Returns
    -------
    int
        0 for a scalar, 1 for ``[1, 2]``, 2 for ``{"a": [1]}``.
    """
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def check_json_text(text: str, what: str) -> None:
    """Refuse JSON text longer than :data:`MAX_JSON_CHARS` or nested deeper than :data:`MAX_JSON_DEPTH`.

    Parameters
    ----------
    text : str
        The option's value.
    what : str
        What the text is, starting the message (e.g. ``"--module-kwargs"``, ``"the JSON value"``).

    Raises
    ------
    ConfigError
        Naming the option, its size or depth, and the limit.
    """
    depth = json_depth(text)
    if depth > MAX_JSON_DEPTH:
        raise ConfigError(f"{what} is nested {depth:,} levels deep, more than the limit of {MAX_JSON_DEPTH} "
                          "for a JSON option; pass a flatter value")
    if len(text) > MAX_JSON_CHARS:
        raise ConfigError(f"{what} has {len(text):,} characters, more than the limit of {MAX_JSON_CHARS:,} "
                          "for a JSON option; pass a smaller value")


def parse_json(text: str, what: str, *, text_if_invalid: bool = False) -> Any:
    """Parse a JSON option after :func:`check_json_text`.

    Parameters
    ----------
    text : str
        The option's value.
    what : str
        The option, for the messages.
    text_if_invalid : bool
        Return ``text`` itself when it is not JSON (so ``last`` means ``"last"``) instead of
        refusing it.

    Returns
    -------
    Any
        The parsed value (or ``text``, see ``text_if_invalid``).

    Raises
    ------
    ConfigError
        Too long, too deep, or (unless ``text_if_invalid``) not JSON.
    """
    check_json_text(text, what)
    try:
        return load_json(text)
    except (ValueError, RecursionError) as exc:
        if text_if_invalid:
            return text
        raise ConfigError(f"{what} must be JSON: {exc}") from None


def internal_error(exc: BaseException) -> str:
    """The one-line description of an unexpected exception, for an entry point's last-resort handler.

    Parameters
    ----------
    exc : BaseException
        The exception no specific handler took.

    Returns
    -------
    str
        ``"internal error (<ExceptionType>: <message>); please report it with the command line"``,
        the message's whitespace collapsed and cut to :data:`MAX_MESSAGE_CHARS` characters.
    """
    message = " ".join(str(exc).split())
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[:MAX_MESSAGE_CHARS] + "..."
    return f"internal error ({type(exc).__name__}: {message}); please report it with the command line"
