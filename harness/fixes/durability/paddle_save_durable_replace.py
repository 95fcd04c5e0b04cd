"""``paddle.save`` opens the file under its final name with "wb" and writes it in place, and nothing is fsynced: not
the file, not its directory. A power loss after the save returned can leave the file empty or missing (the data
and the name were still in the page cache), and a crash while writing leaves a truncated file where the old one
was. A file path is now written to ``<path>.tmp``, fsynced and renamed over the final name, and the directory and
its parent are fsynced (the directory may be new), so the name holds the old file or the whole new one and is
durable when the save returns (a state dict, and any other object pickled by ``paddle.save``). Buffers are written
as before."""

from harness.fixes.patch import Fix, Hunk

_DURABLE = (
    "{i}tmp_path = f\"{{path}}.tmp\"\n"
    "{i}with open(tmp_path, 'wb') as f:\n"
    "{i}    {write}\n"
    "{i}    f.flush()\n"
    "{i}    os.fsync(f.fileno())\n"
    "{i}os.replace(tmp_path, path)\n"
    "{i}# The names: the file's in its directory, the directory's (made above\n"
    "{i}# when it was missing) in its parent.\n"
    "{i}dir_path = os.path.dirname(os.path.abspath(path))\n"
    "{i}for directory in (dir_path, os.path.dirname(dir_path)):\n"
    "{i}    dir_fd = os.open(directory, os.O_RDONLY)\n"
    "{i}    try:\n"
    "{i}        os.fsync(dir_fd)\n"
    "{i}    finally:\n"
    "{i}        os.close(dir_fd)\n"
)

FIX = Fix(
    id="paddle-save-durable-replace",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="paddle.save writes in place and never fsyncs; write <path>.tmp, fsync, rename over path, fsync the dir",
    hunks=(
        Hunk("paddle.framework.io", "save", "26f7ea7d15b0cc46", (
            ("        else:\n"
             "            with _open_file_buffer(path, 'wb') as f:\n"
             "                _pickle_save(obj, f, protocol)\n",
             "        elif _is_file_path(path):\n"
             + _DURABLE.format(i="            ", write="_pickle_save(obj, f, protocol)")
             + "        else:\n"
             "            with _open_file_buffer(path, 'wb') as f:\n"
             "                _pickle_save(obj, f, protocol)\n"),)),
        Hunk("paddle.framework.io", "_legacy_save", "b4e8762ead715f67", (
            ("    else:\n"
             "        with _open_file_buffer(path, 'wb') as f:\n"
             "            pickle.dump(saved_obj, f, protocol=protocol)\n",
             "    elif _is_file_path(path):\n"
             + _DURABLE.format(i="        ", write="pickle.dump(saved_obj, f, protocol=protocol)")
             + "    else:\n"
             "        with _open_file_buffer(path, 'wb') as f:\n"
             "            pickle.dump(saved_obj, f, protocol=protocol)\n"),)),
    ),
    covers=("paddle-save-power-loss-after-save",),
)
