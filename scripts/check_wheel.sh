#!/usr/bin/env bash
# Builds the sdist and the wheel (python -m build, into dist/, which it empties
# first), checks that both hold the package and LICENSE, installs the wheel with
# the plots extra into a venv of its own and runs the README's Python examples
# (the quickstart) there, from a directory outside the checkout, so that the
# installed wheel is what they import.
#
# The venv gets the same TensorFlow, Keras and other dependencies as .venv
# (.venv's `pip freeze` is the constraints file), so pip takes them from its
# cache. By default the venv is new and removed afterwards (1.5 to 4 minutes
# in all on 2 cores, most of it installing TensorFlow); KERAS_ALS_WHEEL_VENV=DIR
# keeps it in DIR, and later runs only swap the wheel (under a minute in all).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
venv=${KERAS_ALS_VENV:-.venv}
root=$PWD
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

rm -rf dist
"$venv/bin/python" -m build --outdir dist . >"$work/build.log" 2>&1 || {
  cat "$work/build.log" >&2
  echo "check_wheel.sh: python -m build failed (above)." >&2
  exit 1
}
wheel=$(ls dist/*.whl)
sdist=$(ls dist/*.tar.gz)
echo "check_wheel: built $wheel and $sdist"

# Both hold every module of the package and the licence; the wheel nothing else.
"$venv/bin/python" - "$wheel" "$sdist" <<'EOF'
import pathlib, sys, tarfile, zipfile

wheel, sdist = sys.argv[1:]
modules = sorted(str(p) for p in pathlib.Path("keras_als").glob("*.py"))
in_wheel = zipfile.ZipFile(wheel).namelist()
in_sdist = [n.split("/", 1)[1] for n in tarfile.open(sdist).getnames() if "/" in n]
problems = [f"wheel lacks {m}" for m in modules if m not in in_wheel]
problems += [f"sdist lacks {m}" for m in modules + ["LICENSE"] if m not in in_sdist]
if not any(n.endswith(".dist-info/licenses/LICENSE") for n in in_wheel):
    problems.append("wheel lacks LICENSE")
problems += [f"wheel holds {n}" for n in in_wheel
             if not n.startswith("keras_als/") and ".dist-info/" not in n]
if problems:
    sys.exit("check_wheel.sh: " + "; ".join(problems))
print(f"check_wheel: wheel: {len(in_wheel)} files, sdist: {len(in_sdist)}, LICENSE in both")
EOF

check=${KERAS_ALS_WHEEL_VENV:-$work/venv}
if [ ! -x "$check/bin/python" ]; then
  base=$("$venv/bin/python" -c 'import sys; print(sys._base_executable)')
  "$base" -m venv "$check"
fi
"$venv/bin/python" -m pip freeze --exclude-editable >"$work/constraints.txt"
start=$SECONDS
if ! { "$check/bin/python" -m pip uninstall -y keras-als &&
       "$check/bin/python" -m pip install -c "$work/constraints.txt" "$root/$wheel[plots]"; } \
     >"$work/pip.log" 2>&1; then
  cat "$work/pip.log" >&2
  echo "check_wheel.sh: installing the wheel failed (above)." >&2
  exit 1
fi
echo "check_wheel: installed the wheel into $check in $((SECONDS - start)) s"

# The README's ```python blocks, each run by the venv's Python from $work.
"$venv/bin/python" - "$work" <<'EOF'
import pathlib, re, sys

blocks = re.findall(r"```python\n(.*?)```", pathlib.Path("README.md").read_text(), flags=re.S)
if not blocks:
    sys.exit("check_wheel.sh: README.md has no ```python block")
for index, block in enumerate(blocks):
    pathlib.Path(sys.argv[1], f"readme_{index}.py").write_text(block)
EOF
cd "$work"
for example in readme_*.py; do
  # TensorFlow's start-up log lines go to the log, shown only on failure.
  TF_CPP_MIN_LOG_LEVEL=3 "$check/bin/python" - "$example" >"$example.log" 2>&1 <<'EOF' ||
import runpy, sys

import keras_als

if "site-packages" not in keras_als.__file__:
    sys.exit(f"check_wheel.sh: imported keras_als from {keras_als.__file__}, not the wheel")
runpy.run_path(sys.argv[1], run_name="__main__")
print(f"check_wheel: README block {sys.argv[1]} ran on keras_als {keras_als.__version__}"
      f" from {keras_als.__file__}")
EOF
    { cat "$example.log" >&2; echo "check_wheel.sh: README block $example failed (above)." >&2;
      exit 1; }
  grep "^check_wheel" "$example.log"
done
echo "check_wheel: passed"
