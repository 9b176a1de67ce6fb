"""What a sub-command of ``kvcore`` says about itself: the line ``kvcore --help`` lists it with,
and the description ``kvcore NAME --help`` opens with.

Each command module declares one :class:`Command` as ``COMMAND``, beside its
``add_options(parser)`` and ``run(args, registry)``; :func:`kvcore.cli.build_parser` builds every
sub-parser from them, so no command repeats how a sub-parser is made.
"""

from __future__ import annotations

import attrs

#: A help text: a string with something in it.
_TEXT = attrs.validators.and_(attrs.validators.instance_of(str), attrs.validators.min_len(1))


@attrs.frozen(kw_only=True)
class Command:
    """A sub-command's help texts.

    Attributes:
        help: one line, lower-case, as ``kvcore --help`` lists the command.
        description: what ``kvcore NAME --help`` says above the options. argparse folds its
            white space and wraps it to the terminal, so it is written as one indented
            paragraph in a triple-quoted string.
    """

    help: str = attrs.field(validator=_TEXT)
    description: str = attrs.field(validator=_TEXT)
