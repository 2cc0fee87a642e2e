#!/usr/bin/env bash
# Builds the sdist and the wheel (python -m build, into dist/, which it empties
# first), checks that both hold the package, py.typed and LICENSE (the sdist the
# long description too, and no tests), that twine check --strict passes them
# (metadata and a long description a package index renders; twine is installed
# into the venv if missing), installs the wheel with the plots extra into a venv
# of its own and runs the README's Python examples (the quickstart) there, from
# a directory outside the checkout, so that the installed wheel is what they
# import.
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

# Both hold every module of the package, py.typed and the licence; the wheel
# nothing else; the sdist the long description it builds from, and no tests
# (they cannot run outside the repository).
"$venv/bin/python" - "$wheel" "$sdist" <<'EOF'
import pathlib, sys, tarfile, tomllib, zipfile

wheel, sdist = sys.argv[1:]
modules = sorted(str(p) for p in pathlib.Path("keras_als").glob("*.py")) + ["keras_als/py.typed"]
readme = tomllib.loads(pathlib.Path("pyproject.toml").read_text())["project"]["readme"]
readme = readme["file"] if isinstance(readme, dict) else readme
in_wheel = zipfile.ZipFile(wheel).namelist()
in_sdist = [n.split("/", 1)[1] for n in tarfile.open(sdist).getnames() if "/" in n]
problems = [f"wheel lacks {m}" for m in modules if m not in in_wheel]
problems += [f"sdist lacks {m}" for m in modules + ["LICENSE", readme] if m not in in_sdist]
problems += [f"sdist holds {n}" for n in in_sdist if n.startswith("tests/")]
if not any(n.endswith(".dist-info/licenses/LICENSE") for n in in_wheel):
    problems.append("wheel lacks LICENSE")
problems += [f"wheel holds {n}" for n in in_wheel
             if not n.startswith("keras_als/") and ".dist-info/" not in n]
if problems:
    sys.exit("check_wheel.sh: " + "; ".join(problems))
print(f"check_wheel: wheel: {len(in_wheel)} files, sdist: {len(in_sdist)}, LICENSE in both")
EOF

# What a package index checks on upload: the metadata, and that the long
# description renders (--strict: warnings fail too).
if ! "$venv/bin/python" -c 'import twine' 2>/dev/null &&
   ! "$venv/bin/python" -m pip install twine >"$work/twine.log" 2>&1; then
  cat "$work/twine.log" >&2
  echo "check_wheel.sh: installing twine failed (above)." >&2
  exit 1
fi
if ! "$venv/bin/python" -m twine check --strict dist/* >"$work/twine.log" 2>&1; then
  cat "$work/twine.log" >&2
  echo "check_wheel.sh: twine check --strict failed (above)." >&2
  exit 1
fi
echo "check_wheel: twine check --strict passed"

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
