"""Off PaddleCloud, ``get_last_checkpoint`` returns the highest-numbered ``checkpoint-N`` directory and checks
nothing else, and ``_save_checkpoint`` writes its ``.checkpoint_done`` marker only with ``FLAG_LLM_PDC``. A job
killed in the middle of a save (a rank's tree, power, the OOM killer) leaves a directory some rank has already made,
so ``resume_from_checkpoint=True`` picks the torn save and fails ("Can't find a valid checkpoint") on every restart,
while the previous checkpoint is intact. Every sync save now ends with the marker (a one-rank job's too, which UC
saves synchronously whatever ``async_save`` says), and the selector walks back from
the newest directory past those a marked folder shows to be unfinished: no marker and no async writer's done signal.
A folder without any marker (saves of older code) is read as before."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddleformers-uc-crashed-save-not-latest",
    kind="fix",
    framework="paddleformers",
    version="1.2.0",
    summary="get_last_checkpoint: off PDC a save killed midway is taken as latest; mark sync saves, skip unfinished",
    hunks=(
        Hunk("paddleformers.trainer.trainer", "Trainer._save_checkpoint", "ba937eef872f3b1a", (
            ("        if strtobool(os.getenv(\"FLAG_LLM_PDC\", \"False\")) and not (\"async_save\" in "
             "self.args.unified_checkpoint_config):\n",
             "        if not (\"async_save\" in self.args.unified_checkpoint_config) or "
             "paddle.distributed.get_world_size() <= 1:\n"),
        )),
        Hunk("paddleformers.trainer.trainer_utils", "get_last_checkpoint", "14d186a4949bc1ff", (
            ("    else:\n"
             "        return os.path.join(folder, max(checkpoints, key=lambda x: "
             "int(_re_checkpoint.search(x).groups()[0])))\n",
             "    else:\n"
             "        # A sync save ends with .checkpoint_done and an async writer leaves .<kind>.done.<rank>: in a\n"
             "        # folder whose saves are marked, a directory with neither is a save that never finished.\n"
             "        newest_first = sorted(checkpoints, key=lambda x: int(_re_checkpoint.search(x).groups()[0]), "
             "reverse=True)\n"
             "        marked = [os.path.exists(os.path.join(folder, i, \".checkpoint_done\")) for i in newest_first]\n"
             "        for i, done in zip(newest_first, marked):\n"
             "            signals = [f for f in os.listdir(os.path.join(folder, i)) if \".done.\" in f]\n"
             "            if done or signals or not any(marked):\n"
             "                return os.path.join(folder, i)\n"
             "        return\n"),
        )),
    ),
    covers=("paddleformers-uc-crashed-save-taken-as-latest",),
)
