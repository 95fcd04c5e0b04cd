"""``FileSystemWriter`` fsyncs its data files and ``.metadata.tmp`` (``sync_files=True``, the default) but never a
directory: not the parent after ``mkdir`` of the checkpoint directory, not the checkpoint directory after the ranks
created their data files in it, nor after the coordinator renamed ``.metadata.tmp`` to ``.metadata``. A new or
renamed name is durable only once its directory is fsynced, so a power loss can drop the ``.metadata`` name of a
save that returned, a rank's ``__R_0.distcp`` that a surviving ``.metadata`` names, or the whole directory, and the
checkpoint no longer loads. ``finish`` (which runs once every rank's data is written) now fsyncs the checkpoint
directory and its parent before the rename, so the names the metadata points at are durable before it appears,
and the checkpoint directory again after it, on the local file system, when ``sync_files`` is set."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="torch-dcp-sync-checkpoint-dir",
    kind="fix",
    framework="torch",
    version="2.13.0",
    summary="FileSystemWriter never fsyncs a directory; finish fsyncs the checkpoint dir before and after the rename",
    hunks=(Hunk("torch.distributed.checkpoint.filesystem", "_FileSystemWriter.finish", "cc0038e467d7cd9d", (
        ("        self.fs.rename(tmp_path, metadata_path)\n",
         "        def sync_dir(directory: Path) -> None:\n"
         "            dir_fd = os.open(directory, os.O_RDONLY)\n"
         "            try:\n"
         "                os.fsync(dir_fd)\n"
         "            finally:\n"
         "                os.close(dir_fd)\n"
         "\n"
         "        # A name is durable only once its directory is synced: the data files\n"
         "        # (and the checkpoint directory itself) before the metadata names them,\n"
         "        # the metadata before the save returns.\n"
         "        sync_dirs = self.sync_files and isinstance(self.fs, FileSystem)\n"
         "        if sync_dirs:\n"
         "            sync_dir(Path(self.path))\n"
         "            sync_dir(Path(self.path).parent)\n"
         "\n"
         "        self.fs.rename(tmp_path, metadata_path)\n"
         "\n"
         "        if sync_dirs:\n"
         "            sync_dir(Path(self.path))\n"),)),),
    covers=("torch-dcp-directory-never-fsynced",),
    requires=("torch-dcp-metadata-flush-before-fsync",),
)
