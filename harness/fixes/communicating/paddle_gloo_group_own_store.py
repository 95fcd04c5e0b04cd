"""``new_group`` on gloo: the process group's constructor connects its own full mesh through the world's store with
no prefix (the communication context it also makes uses one, the group id), so every group rendezvouses on the
same keys as the world and every group before it. Groups made in turn, disjoint groups made at once, and a group of
three ranks or more of a larger world read each other's (or the world's) addresses: ranks die of ``Connection
refused`` or hang in a ``TIMEOUT``. Fleet's hybrid groups (2 × 2 on 4 ranks), full_param's horizontal and vertical
groups, parallel_broadcast's grid and a load on a process group of 3 ranks out of 4 meet it.

The upstream fix is the prefix in ``ProcessGroupGloo``'s constructor (C++); Python cannot hand it a prefixed store
(``Store`` takes no overrides from Python). The workaround gives each gloo group a store of its own, which is what
the prefix makes of the world's: the group's first rank serves a ``TCPStore`` on a free port it publishes under the
group id in the world's store, and the other members meet on it."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-gloo-group-own-store",
    kind="workaround",
    framework="paddle",
    version="3.3.1",
    summary="new_group on gloo: the group's mesh meets on the world's unprefixed keys; give it a store of its own",
    hunks=(Hunk("paddle.distributed.collective", "new_group", "fcf4b3b615b4b09b", (
        ("            pg = _new_process_group_impl(\n"
         "                backend,\n"
         "                _default_store,\n",
         "            group_store = _default_store\n"
         "            if (backend or _default_backend) == 'gloo':  # its mesh would meet on the world's keys\n"
         "                import socket\n"
         "\n"
         "                key = f'gloo_group_store/{gid}'\n"
         "                if rank == 0:\n"
         "                    host = _get_global_env().current_endpoint.split(':')[0]\n"
         "                    with socket.socket() as probe:\n"
         "                        probe.bind((host, 0))\n"
         "                        port = probe.getsockname()[1]\n"
         "                    _default_store.set(key, f'{host}:{port}'.encode())\n"
         "                    group_store = core.TCPStore(host, port, True, size)\n"
         "                else:\n"
         "                    where = bytes(_default_store.get(key)).decode()\n"
         "                    host, port = where.rsplit(':', 1)\n"
         "                    group_store = core.TCPStore(host, int(port), False, size)\n"
         "                globals().setdefault('_gloo_group_stores', {})[gid] = group_store\n"
         "            pg = _new_process_group_impl(\n"
         "                backend,\n"
         "                group_store,\n"),
    )),),
    covers=("paddle-gloo-new-group-race",),
)
