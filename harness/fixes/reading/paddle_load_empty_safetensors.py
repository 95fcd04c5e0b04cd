"""``paddle.load(..., safetensors=True)`` has safetensors' paddle loader view the file's bytes as each tensor, and
Paddle's C++ cannot take an empty one: the uint8 view of no bytes fails its stride check, and two empty tensors of a
1-byte dtype share one pointer whose deleter is gone when the second is freed (an abort). An empty tensor holds no
bytes to read, so it is made with ``paddle.empty`` of the header's shape and dtype; only the others are read."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-load-empty-safetensors",
    kind="workaround",
    framework="paddle",
    version="3.3.1",
    summary="load: an empty safetensors tensor fails or aborts as a view of the file; make it with paddle.empty",
    hunks=(Hunk("paddle.framework.io", "load", "07a4c7064df39a8b", (
        ("                    from safetensors.paddle import load_file\n\n",
         "                    from safetensors.paddle import _getdtype, load_file\n\n"
         "                    def get_tensor(f, k):\n"
         "                        # Paddle cannot view an empty tensor over the file: it holds no bytes to read.\n"
         "                        shape = f.get_slice(k).get_shape()\n"
         "                        if 0 in shape:\n"
         "                            dtype = _getdtype(f.get_slice(k).get_dtype())\n"
         "                            return paddle.empty(shape, dtype=dtype)\n"
         "                        return f.get_tensor(k)\n\n"),
        ("                                load_result[k] = f.get_tensor(k).cuda()\n",
         "                                load_result[k] = get_tensor(f, k).cuda()\n"),
        ("                    else:\n                        load_result = load_file(path, device='cpu')\n",
         "                    elif (\n"
         '                        safetensors.__version__ > "0.6.2"\n'
         '                        and paddle.__version__ >= "3.2.0"\n'
         "                    ):\n"
         '                        with safetensors.safe_open(path, framework="paddle") as f:\n'
         "                            load_result = {k: get_tensor(f, k) for k in f.keys()}\n"
         "                    else:\n                        load_result = load_file(path, device='cpu')\n"),
    )),),
    covers=("paddle-dcp-zero-size-safetensors", "paddle-dcp-zero-size-safetensors-abort",
            "paddle-save-zero-size-safetensors", "paddle-save-two-empty-safetensors-abort"),
    requires=("paddle-dcp-flatten-0d",),  # the -abort case's 0-d flat tensor then fails with that bug
)
