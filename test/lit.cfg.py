# lit configuration for meshplan's FileCheck suites.
import os

import lit.formats

config.name = "meshplan"
# Bash, so RUN lines can use pipes and redirections plainly.
config.test_format = lit.formats.ShTest(execute_external=True)
config.suffixes = [".test", ".mlir"]
config.excludes = ["Inputs", "Utils", "CMakeLists.txt", "lit.cfg.py"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.meshplan_obj_root, "test")

config.environment["PATH"] = os.pathsep.join(
    [config.meshplan_tools_dir, config.llvm_tools_dir, config.environment.get("PATH", "")]
)
# Variables must be scoped to their CHECK-LABEL block (as in Shardy's suite).
config.environment["FILECHECK_OPTS"] = "-enable-var-scope"

# MESHPLAN_VERIFY_ROUNDTRIP=1 runs every meshplan-opt call with
# --verify-roundtrip (print, parse back, compare), as CIRCT's suite does.
opt = os.path.join(config.meshplan_tools_dir, "meshplan-opt")
if os.environ.get("MESHPLAN_VERIFY_ROUNDTRIP", "0") not in ("", "0"):
    opt += " --verify-roundtrip"
config.substitutions.append(("%meshplan-opt", opt))

utils = os.path.join(config.test_source_root, "Utils")
config.substitutions.append(("%meshplan", os.path.join(config.meshplan_tools_dir, "meshplan")))
# %expect-error CMD: CMD must exit with code 2 and print nothing on stdout;
# its stderr is passed through for FileCheck.
config.substitutions.append(("%expect-error", "bash " + os.path.join(utils, "expect-error.sh")))
# An address-space limit for the hostile-input tests (limits.test). Under
# AddressSanitizer it cannot apply: the sanitizer reserves terabytes of
# shadow address space at start; the tests' time limits still hold.
sanitized = "sanitize=address" in getattr(config, "cxx_flags", "")
config.substitutions.append(
    ("%limit-address-space", "true" if sanitized else "ulimit -v 8000000"))
