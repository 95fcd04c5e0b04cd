"""``paddle.async_save`` warns that its configs are overridden and drops them: ``safetensors=True`` writes a pickle.
The writer thread calls ``paddle.save``, which takes the same configs, so they are passed on."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-save-async-configs",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="async_save: **configs (safetensors=True among them) never reach the writer's paddle.save; pass them",
    hunks=(Hunk("paddle.framework.io", "async_save", "b4387d794827b5f7", (
        ("    if len(configs) > 0:\n        warnings.warn(\n"
         "            \"configs are not supported in async mode, will be overridden by default settings.\"\n"
         "        )\n\n", ""),
        ("    t = threading.Thread(target=save, args=(obj, path, protocol))\n",
         "    t = threading.Thread(target=save, args=(obj, path, protocol), kwargs=configs)\n"),
    )),),
    covers=("paddle-save-async-safetensors-writes-pickle",),
)
