"""torchrun (torch.distributed.run) as Debian 12 ships it, with one fix.

torch 1.13's launcher reads its --redirects and --tee values with
Std.from_str, which under Python 3.11 returns None for "0" (enum.Flag no
longer iterates NONE), and then fails in to_map. Here None means "no
redirection", as it was meant to; everything else is torchrun itself.

    python3 tests/hosts/torchrun.py --nnodes=2 ... SCRIPT
"""

import sys

import torch.distributed.elastic.multiprocessing as mp
import torch.distributed.elastic.multiprocessing.api as api
from torch.distributed.run import main

_to_map = api.to_map


def _to_map_none_is_none(val_or_map, local_world_size):  # type: ignore[no-untyped-def]
    return _to_map(api.Std.NONE if val_or_map is None else val_or_map, local_world_size)


api.to_map = _to_map_none_is_none
mp.to_map = _to_map_none_is_none

if __name__ == "__main__":
    sys.exit(main())
