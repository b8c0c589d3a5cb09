"""Entry point of the zygote and the cold launcher: ``python -I .../sandbox/__main__.py --zygote|--launch``.

Run as a script in an isolated interpreter, it loads this package under a name
of its own, so that importing it runs nothing of the rest of wmrl (whose
top level imports torch): the zygote's memory is the sandbox's and what it
preloads, nothing else.
"""

import importlib.util
import json
import os
import sys


def _package():
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location("wmrl_sandbox", os.path.join(here, "__init__.py"),
                                                  submodule_search_locations=[here])
    module = importlib.util.module_from_spec(spec)
    sys.modules["wmrl_sandbox"] = module
    spec.loader.exec_module(module)
    return importlib.import_module("wmrl_sandbox.zygote")


if __name__ == "__main__":
    zygote = _package()
    if sys.argv[1:2] == ["--zygote"]:
        zygote._zygote_main(int(sys.argv[2]), json.loads(sys.argv[3]))
    elif sys.argv[1:2] == ["--launch"]:
        zygote._launch_main(sys.argv[2], sys.argv[3])
    else:
        sys.exit("usage: python -I .../sandbox/__main__.py --zygote FD PRELOAD_JSON | --launch FDS_JSON REQUEST_JSON")
