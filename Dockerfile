# syntax=docker/dockerfile:1
# The controller's image. Build it from the repository root:
#   docker build -t autoapproval:0.2.0 .
# With its revision: add --build-arg AUTOAPPROVAL_GIT_REVISION="$(git rev-parse HEAD)".
# The binary links rustls (no OpenSSL), so the runtime stage needs only glibc and CA roots:
# distroless cc, no shell, no package manager, running as a numeric non-root user.
# Without an engine, scripts/build-image.sh builds the same image (docs/IMAGE.md).
#
# Both base images are pinned by digest (a tag moves; a digest names the same bytes forever).
# The digests were read from public Dockerfiles that pin the same tags (no registry is reachable
# where this was written); to move to newer ones, `crane digest TAG` or
# `skopeo inspect docker://TAG` and change both lines.

FROM rust:1.95.0-bookworm@sha256:6258907abe69656e41cd992e0b705cdcfabcbbe3db374f92ed2d47121282d4a1 AS builder
WORKDIR /src
# The workspace (the tooling crates only so that cargo can resolve the lockfile: `-p autoapproval`
# builds none of them) and the migrations that `sqlx::migrate!` embeds into the binary.
COPY Cargo.toml Cargo.lock build.rs ./
COPY src ./src
COPY migrations ./migrations
COPY crates ./crates
# The cache mounts keep the registry and the build between builds; the binary is copied out of
# the cached target directory in the same step. With `otlp`, the chart's tracing.enabled works.
# The git revision `autoapproval_build_info` reports: .git is not in the build context, so pass it,
#   docker build --build-arg AUTOAPPROVAL_GIT_REVISION="$(git rev-parse HEAD)" .
# (build.rs reads the variable; without it the revision is "unknown").
ARG AUTOAPPROVAL_GIT_REVISION=""
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p autoapproval --bin autoapproval --features otlp \
    && install -D -m 0755 target/release/autoapproval /out/autoapproval

FROM gcr.io/distroless/cc-debian12:nonroot@sha256:9dac0a79194e45a7da0158a9c6da57b217585af0786db3845d1f0ec1a0dd182f
COPY --from=builder /out/autoapproval /autoapproval
# distroless's nonroot user, by number so the kubelet can check runAsNonRoot.
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/autoapproval"]
CMD ["run"]
