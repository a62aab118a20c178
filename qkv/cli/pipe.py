"""A pipe answers every line it can: ``qkv translate`` and ``qkv generate`` over stdin.

Lines go through the model in groups (a batch is faster than lines one by one). A line the model
cannot take (too long for its positions, an empty prompt without a start token: an ``InputError``)
does not stop the others: its group is answered again line by line, the bad line gets one error line
on stderr with its number and an empty output line (so output line N still answers input line N),
and the exit code, at the end, says that some failed.
"""

from __future__ import annotations

import sys
from typing import Callable, Iterable, Sequence, TextIO

from qkv.generation.api import InputError

BAD_LINES = 2  # the exit code when some lines could not be answered: bad input, as every input error


def answer_each(groups: Iterable[list[str]], answer: Callable[[list[str]], Sequence[str]], out: TextIO,
                command: str, where: str, describe: Callable[[InputError], str] = str) -> int:
    """Write ``answer(group)`` for every group of input lines, one output line per input line.

    Args:
        groups: the input lines, in groups answered together.
        answer: the model's answers to a group, one string per line (each already one line).
        out: where the answers go (flushed after each group, for a producer that waits).
        command: the command's name, for the error lines (``translate``).
        where: the input's name, for the error lines (``stdin`` or a file).
        describe: what to say of a line's error, after ``where, line N:``.

    Returns:
        0 if every line was answered, else :data:`BAD_LINES` (after a last line that counts them).
    """
    n_lines = failed = 0
    for group in groups:
        try:
            answers = list(answer(group))
        except InputError:  # which line: answer them one by one
            answers = []
            for i, line in enumerate(group):
                try:
                    answers.extend(answer([line]))
                except InputError as e:
                    failed += 1
                    answers.append("")
                    print(f"qkv {command}: error: {where}, line {n_lines + i + 1}: {describe(e)}", file=sys.stderr)
        out.write("".join(text + "\n" for text in answers))
        out.flush()
        n_lines += len(group)
    if failed:
        print(f"qkv {command}: {failed} of {n_lines} lines could not be answered (an empty line stands for each)",
              file=sys.stderr)
        return BAD_LINES
    return 0


__all__ = ["answer_each", "BAD_LINES"]
