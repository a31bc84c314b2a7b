# Sourced by scripts/test, scripts/demo and scripts/bench: creates (or reuses) a virtual environment
# for one Django line and installs the project with its dev extras into it.
#   make_venv DIR PYTHON DJANGO_SPEC   -> leaves "$DIR/bin/python" ready to use

pick_python() {
    # Prefer Python 3.12 (Django 6.0); fall back to python3. pyenv shims fail unless
    # PYENV_VERSION names an installed version, so try that too.
    local candidate
    if python3.12 -c 'import sys' >/dev/null 2>&1; then echo "python3.12"; return; fi
    if command -v pyenv >/dev/null 2>&1; then
        for candidate in $(pyenv versions --bare 2>/dev/null | grep -E '^3\.12(\.|$)' | sort -rV); do
            if PYENV_VERSION="$candidate" python3.12 -c 'import sys' >/dev/null 2>&1; then
                echo "PYENV_VERSION=$candidate python3.12"; return
            fi
        done
    fi
    echo "python3"
}

make_venv() {
    # One builder at a time per directory: concurrent callers wait, then reuse it.
    local lockfile="${1%/}.lock"
    (
        flock 9
        _make_venv_locked "$@"
    ) 9>"$lockfile"
}

_make_venv_locked() {
    local dir="$1" python="$2" django="$3" stamp
    # Rebuild only when what gets installed changes: the [project] table and the line.
    stamp="$(sed -n '/^\[project\]/,/^\[tool/p' pyproject.toml; echo "$python $django")"
    if [ -x "$dir/bin/python" ] && [ "$(cat "$dir/.stamp" 2>/dev/null)" = "$stamp" ]; then
        return 0
    fi
    rm -rf "$dir"
    echo ">> creating $dir with $python ($django)" >&2
    env $python -m venv "$dir"
    local log="$dir/.install.log"
    if ! { "$dir/bin/python" -m pip install --upgrade pip \
           && "$dir/bin/python" -m pip install -e ".[dev,prometheus,sentry]" "$django"; } >"$log" 2>&1; then
        tail -n 40 "$log" >&2
        echo "!! installing into $dir failed (full log: $log)" >&2
        return 1
    fi
    printf '%s' "$stamp" > "$dir/.stamp"
}
