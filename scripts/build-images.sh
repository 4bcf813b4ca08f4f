#!/usr/bin/env bash
# Builds the images compose.yaml and the container tests use without any image registry, under
# their public names so that nothing pulls:
#   nats:2.15-alpine     busybox (Debian's busybox-static) + the nats-server the tests run (>= 2.12;
#                        Debian unstable's 2.15 from scripts/get-nats-server.sh) + the libraries
#                        `ldd` names; the official image's entrypoint, config path, ports and `wget`.
#                        An image of that name carrying another nats-server is built again.
#   typed-service:local  what cluster/Dockerfile builds: a Debian bookworm minbase root
#                        (debootstrap, with bubblewrap for the microVM sandbox), this machine's
#                        node (>= 20), and /app: `npm ci --omit=dev` plus the esbuild bundle.
# Root filesystems are assembled under .images/ (gitignored) and `docker import`ed; the service
# layer is a `docker build` FROM the imported Debian base with a local context only.
#
#   bash scripts/build-images.sh            # builds what is missing; --rebuild builds all again
set -euo pipefail
cd "$(dirname "$0")/.."

NATS_IMAGE="${NATS_IMAGE:-nats:2.15-alpine}"
SERVICE_IMAGE="${SERVICE_IMAGE:-typed-service:local}"
BASE_IMAGE="typed-service-base:bookworm-libatomic"
work="$PWD/.images"
rebuild="${1:-}"

has_image() { [ "$rebuild" != "--rebuild" ] && docker image inspect "$1" >/dev/null 2>&1; }

# Copies each binary and the shared libraries `ldd` lists for it into the root $1, at the same paths.
copy_with_libraries() {
  local root="$1" binary
  shift
  for binary in "$@"; do
    mkdir -p "$root$(dirname "$binary")"
    cp -L "$binary" "$root$binary"
    ldd "$binary" 2>/dev/null | grep -o '/[^ ]*' | while read -r lib; do
      mkdir -p "$root$(dirname "$lib")"
      cp -L "$lib" "$root$lib"
    done
  done
}

build_nats() {
  local nats root="$work/nats-root" debs="$work/debs"
  nats="$(bash scripts/get-nats-server.sh | sed -n 's/.* at //p')"
  # Kept only while it carries the nats-server the tests run (not the 2.10 an older checkout built).
  if has_image "$NATS_IMAGE" && [ "$(docker run --rm "$NATS_IMAGE" --version)" = "$("$nats" --version)" ]; then
    echo "$NATS_IMAGE: present, $("$nats" --version)"
    return
  fi
  case "$NATS_IMAGE" in *":$("$nats" --version | sed -n 's/.*v\([0-9]*\.[0-9]*\).*/\1/p')-"*) ;;
    *) echo "warning: $NATS_IMAGE will carry $("$nats" --version) ($nats): update its tag in compose.yaml, this script and test/helpers/nats-container.ts" >&2 ;;
  esac
  rm -rf "$root" "$debs" && mkdir -p "$root"/{bin,tmp,data,etc/nats,usr/local/bin} "$debs"
  chmod 1777 "$root/tmp"
  (cd "$debs" && { apt-get download busybox-static 2>/dev/null || { apt-get update -qq && apt-get download busybox-static; }; })
  dpkg-deb -x "$debs"/busybox-static_*.deb "$debs/x"
  cp "$debs/x/bin/busybox" "$root/bin/busybox"
  for applet in $("$root/bin/busybox" --list); do [ -e "$root/bin/$applet" ] || ln -s busybox "$root/bin/$applet"; done
  mkdir -p "$root/usr/local/bin" && cp -L "$nats" "$root/usr/local/bin/nats-server"
  copy_with_libraries "$root" "$(readlink -f "$nats")"
  rm -f "$root$(readlink -f "$nats")"
  # As in the official image: flags alone run nats-server with them.
  cat >"$root/usr/local/bin/docker-entrypoint.sh" <<'SH'
#!/bin/sh
set -e
if [ "$#" -eq 0 ] || [ "${1#-}" != "$1" ]; then set -- nats-server "$@"; fi
exec "$@"
SH
  chmod +x "$root/usr/local/bin/docker-entrypoint.sh"
  printf 'port: 4222\nmonitor_port: 8222\n' >"$root/etc/nats/nats-server.conf"
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$root/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
  tar -C "$root" -c . | docker import \
    --change 'ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENTRYPOINT ["docker-entrypoint.sh"]' \
    --change 'CMD ["nats-server", "--config", "/etc/nats/nats-server.conf"]' \
    --change 'EXPOSE 4222 6222 8222' - "$NATS_IMAGE" >/dev/null
  echo "$NATS_IMAGE: $(docker run --rm "$NATS_IMAGE" --version)"
}

build_base() {
  if has_image "$BASE_IMAGE"; then echo "$BASE_IMAGE: present"; return; fi
  command -v debootstrap >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
  local root="$work/debian-root" mirror
  mirror="$(bash scripts/debian-fetch.sh --mirror | cut -d' ' -f1)"
  rm -rf "$root"
  echo "debootstrap bookworm (minbase + bubblewrap) from $mirror" >&2
  debootstrap --variant=minbase --include=bubblewrap,libstdc++6,libatomic1 bookworm "$root" "$mirror" >"$work/debootstrap.log" 2>&1 ||
    { tail -n 20 "$work/debootstrap.log" >&2; exit 1; }
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -c . | docker import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' - "$BASE_IMAGE" >/dev/null
  echo "$BASE_IMAGE: imported"
}

build_service() {
  if has_image "$SERVICE_IMAGE"; then echo "$SERVICE_IMAGE: present"; return; fi
  local context="$work/service" node nats
  node="$(readlink -f "$(command -v node)")"
  [ "$(node -p 'process.versions.node.split(".")[0]')" -ge 22 ] || { echo "error: node >= 22 needed for the image" >&2; exit 1; }
  rm -rf "$context" && mkdir -p "$context/app"
  cp "$node" "$context/node"
  # What cluster/Dockerfile's `COPY . .` takes: the work tree without what git ignores.
  git ls-files -co --exclude-standard -z | tar --null -T - -c | tar -C "$context/app" -x
  # The postinstall's nats-server: the one already here (the image runs none).
  nats="$(bash scripts/get-nats-server.sh | sed -n 's/.* at //p')"
  (cd "$context/app" && NATS_SERVER_BIN="$nats" npm ci --omit=dev --no-audit --no-fund --prefer-offline --loglevel=error >/dev/null && npm run -s build)
  cat >"$context/Dockerfile" <<DOCKERFILE
FROM $BASE_IMAGE
COPY node /usr/local/bin/node
COPY app /app
WORKDIR /app
EXPOSE 8787 8788 8789
CMD ["node", "dist/main.mjs"]
DOCKERFILE
  DOCKER_BUILDKIT=0 docker build -q -t "$SERVICE_IMAGE" "$context" >/dev/null 2>&1
  # The node copied in must run there (its shared libraries are in the base: libstdc++6, libatomic1).
  local version
  version="$(docker run --rm "$SERVICE_IMAGE" node --version)" ||
    { echo "error: node does not run in $SERVICE_IMAGE (a shared library missing from $BASE_IMAGE?)" >&2; exit 1; }
  echo "$SERVICE_IMAGE: node $version, $(docker run --rm "$SERVICE_IMAGE" bwrap --version)"
}

mkdir -p "$work"
build_nats
build_base
build_service
