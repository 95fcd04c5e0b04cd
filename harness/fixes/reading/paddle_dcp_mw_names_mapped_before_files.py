"""``get_rank_to_files`` picks the files a load must read by the state dict's keys as given, and only afterwards
maps a master weight named in the other graph mode's style (``mw_name_compatibility``) to its stored name. A file
needed only for such a master weight is never read: a load whose keys are all renamed master weights finds "no
necessary data files" and fails with ``KeyError`` on the key, and one whose master weight has pieces in a file no
other key needs fails with ``KeyError`` on that piece's index. The names are mapped first, then the files chosen."""

from harness.fixes.patch import Fix, Hunk

FIX = Fix(
    id="paddle-dcp-mw-names-mapped-before-files",
    kind="fix",
    framework="paddle",
    version="3.3.1",
    summary="get_rank_to_files: files are chosen before master-weight names are mapped; renamed ones go unread",
    hunks=(Hunk("paddle.distributed.flex_checkpoint.dcp.load_state_dict", "get_rank_to_files", "c2bb854c12e14910", (
        ("    necessary_files = []\n", "    stored_files = []\n"),
        ("            tensor_key_list.append(local_tensor_index.tensor_key)\n"
         "            if local_tensor_index.tensor_key in state_dict_param_names:\n"
         "                necessary_files.append(file_name)\n",
         "            tensor_key_list.append(local_tensor_index.tensor_key)\n"
         "            stored_files.append((local_tensor_index.tensor_key, file_name))\n"
         "\n"
         "    renamed = state_dict_param_names - set(tensor_key_list)\n"
         "    if mw_name_compatibility and renamed:\n"
         "        mw_name_compatibility_mapping = _modify_mw_name_for_compatibility(\n"
         "            state_dict, renamed, tensor_key_list\n"
         "        )\n"
         "        state_dict_param_names = {\n"
         "            key if isinstance(key, str) else key[0] for key in state_dict.keys()\n"
         "        }\n"
         "    necessary_files = [\n"
         "        file for key, file in stored_files if key in state_dict_param_names\n"
         "    ]\n"),
        ("            mw_name_compatibility_mapping = _modify_mw_name_for_compatibility(\n",
         "            mw_name_compatibility_mapping |= _modify_mw_name_for_compatibility(\n"),
    )),),
    covers=("paddle-dcp-mw-rename-files-not-read",),
)
