"""``get_max_id`` finds the newest version by ``<rank>_<id>.distcp`` file names only; a safetensors checkpoint has
``<rank>_<id>.safetensors`` files, so it gives 0 and loading the latest reads the oldest version. The data files of
both formats count."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-dcp-max-id-safetensors",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="get_max_id: only *.distcp names count, so safetensors 'latest' is version 0; count *.safetensors too",
    hunks=(Hunk("paddle.distributed.flex_checkpoint.dcp.utils", "get_max_id", "80193346889c3fc3", (
        ('    pattern = re.compile(r"^(\\d+)_(\\d+)\\.distcp$")\n',
         '    pattern = re.compile(r"^(\\d+)_(\\d+)\\.(distcp|safetensors)$")\n'),)),),
    covers=("paddle-dcp-latest-safetensors-loads-oldest",),
    requires=("paddle-dcp-version-cache-key",),
)
