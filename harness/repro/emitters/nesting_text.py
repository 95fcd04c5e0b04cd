"""The script text of a nested state dict (reference/nesting.py's meaning), shared by every framework's repro: the
case's names split at ``NESTED`` into dict keys, with ``EMPTY_DICTS`` there and empty."""

NESTING = '''def nest(flat):
    """The nested dict: each name's parts at NESTED are its keys; EMPTY_DICTS are there, empty."""
    root = {}
    for name in EMPTY_DICTS:
        node = root
        for part in name.split(NESTED):
            node = node.setdefault(part, {})
    for name, value in flat.items():
        *parents, last = name.split(NESTED)
        node = root
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return root


def at(tree, name):
    for part in name.split(NESTED):
        tree = tree[part]
    return tree


'''
