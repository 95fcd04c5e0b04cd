"""``FileSystemWriter.finish`` writes the new ``.metadata.tmp``, then removes the existing ``.metadata`` ("in case
other checkpoints were present") and only then renames the temporary file to ``.metadata``. A re-save killed
between the two leaves no ``.metadata`` at all: the acknowledged checkpoint no longer loads, though a complete new
metadata file lies beside it. A rename replaces its target atomically, so the local file system now renames with
``Path.replace`` (which replaces on every platform, Windows included) and the removal is kept only for other file
systems, whose rename may refuse an existing target."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="torch-dcp-metadata-atomic-replace",
    kind="fix",
    framework="torch",
    version="2.13.0",
    summary="FileSystemWriter.finish removes the old .metadata before renaming the new one over it; rename replaces",
    hunks=(
        Hunk("torch.distributed.checkpoint.filesystem", "_FileSystemWriter.finish", "cc0038e467d7cd9d", (
            ("        if self.fs.exists(metadata_path):\n"
             "            self.fs.rm_file(metadata_path)\n",
             "        # A local rename replaces the old metadata atomically: removing it\n"
             "        # first would leave no metadata at all to a crash in between.\n"
             "        if not isinstance(self.fs, FileSystem) and self.fs.exists(metadata_path):\n"
             "            self.fs.rm_file(metadata_path)\n"),)),
        Hunk("torch.distributed.checkpoint.filesystem", "FileSystem.rename", "dced558ba5cfd4f4", (
            ("        path.rename(cast(Path, new_path))\n",
             "        path.replace(cast(Path, new_path))\n"),)),
    ),
    covers=("torch-dcp-resave-removes-metadata-before-rename",),
)
