# Sourced by the scripts that build a venv under the flagtrial cache ($CACHE/NAME, built as
# NAME.tmp-* and renamed into place). `one_install NAME` returns with this shell holding the
# install's lock (fd 9, released when the script ends): prints the venv and exits where it is
# already built, by an install this one waited for included; removes what a killed install
# left.
one_install() {
  local out="$CACHE/$1"
  if [ -x "$out/bin/python" ]; then
    echo "$out"
    exit 0
  fi
  mkdir -p "$CACHE"
  exec 9>"$CACHE/$1.lock"
  flock 9
  if [ -x "$out/bin/python" ]; then
    echo "$out"
    exit 0
  fi
  rm -rf "$CACHE/$1.tmp-"*
}
