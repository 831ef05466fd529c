"""The one error type that carries problems, and its two kinds.

`Problems` holds one line per problem, each naming where (file, line, field, object, flag). Its kinds
say what the command line does with it:

- `InputError`: input the operator must fix (a policy, a snapshot directory, a kubeconfig, a trace,
  flags): exit 2;
- any other `Problems`: the cluster, Prometheus or the daemon could not be used: exit 1.

Every module that refuses with problems subclasses one of these, so nothing else needs to know them.
It must not import anything of the rebalancer.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["InputError", "Problems"]


class Problems(Exception):
    """Something could not be done; `problems` holds one line per problem, each naming where."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = tuple(problems)


class InputError(Problems):
    """Input the operator must fix; each problem names the file (line, field) or flag."""
