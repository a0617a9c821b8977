"""The object-store client: one S3 bucket behind a small, retrying, picklable wrapper.

Built on ``obstore`` (Rust ``object_store`` + tokio; calls release the GIL), chosen after
``benchmarks/bench_s3.py`` measured it against boto3 and s3fs (see ``docs/s3.md``). The SDK is imported
on first use, never by ``import headrace``.

Retries are ours, not the SDK's (obstore's own retries are turned off), so that one policy covers
every failure, including a connection dropped half-way through a response body, which the SDK does
not retry: 5xx answers, throttling (503 SlowDown, 429), timeouts and connection resets are retried with
exponential backoff and full jitter; after ``max_attempts`` a :class:`RemoteError` names the key. 4xx
answers (missing key, access denied) are not retried.

Configuration, each value taken from the first place that sets it:

* endpoint: ``endpoint=`` > ``HEADRACE_S3_ENDPOINT`` > ``MX8_S3_ENDPOINT_URL`` > ``AWS_ENDPOINT_URL_S3``
  > ``AWS_ENDPOINT_URL`` > ``endpoint_url`` in the profile > AWS.
* region: ``region=`` > ``AWS_REGION`` > ``AWS_DEFAULT_REGION`` > the profile > ``us-east-1``.
* credentials: ``access_key_id=``/``secret_access_key=`` > the ``AWS_*`` environment variables > the
  profile (``profile=`` > ``AWS_PROFILE`` > ``default``) in ``~/.aws/credentials`` and
  ``~/.aws/config`` (``AWS_SHARED_CREDENTIALS_FILE``/``AWS_CONFIG_FILE``) > instance metadata.
* ``allow_http``: plain HTTP is allowed for loopback endpoints (moto, a local MinIO) and otherwise
  only when asked for.
* addressing: ``path_style=`` > ``MX8_S3_FORCE_PATH_STYLE`` (``0``/``false``: virtual-hosted) >
  path-style (``endpoint/bucket/key``); virtual-hosted requests go to ``bucket.endpoint-host/key``.
"""

from __future__ import annotations

import configparser
import dataclasses
import os
import pathlib
import random
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from typing import Any, TypeVar
from urllib.parse import urlsplit

from headrace._base.errors import ConfigError, RemoteError

__all__ = ["ObjectInfo", "ObjectNotFoundError", "ObjectStore", "S3Options", "split_s3_url"]

T = TypeVar("T")

_LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}
# HTTP statuses worth retrying besides 5xx: request timeout and "too many requests" (throttling).
_RETRY_4XX = {408, 429}
_STATUS_RE = re.compile(r"status code: (\d{3})")


class ObjectNotFoundError(RemoteError, FileNotFoundError):
    """The key does not exist (not retried)."""


@dataclasses.dataclass(frozen=True)
class ObjectInfo:
    """What a listing or HEAD says about one object."""

    key: str
    size: int
    etag: str
    mtime_ns: int


@dataclasses.dataclass(frozen=True)
class S3Options:
    """How to reach S3 and how hard to try.

    Attributes:
        endpoint: custom endpoint URL (MinIO, R2, moto), ``None`` = from the environment / AWS.
        region: AWS region, ``None`` = from the environment / profile / ``us-east-1``.
        profile: named profile in the AWS config files, ``None`` = ``AWS_PROFILE`` / ``default``.
        allow_http: allow ``http://`` endpoints; ``None`` = only for loopback hosts.
        path_style: ``True``: path-style requests (``endpoint/bucket/key``); ``False``:
            virtual-hosted (``bucket.host/key``, the bucket put in front of the endpoint's host);
            ``None`` = ``MX8_S3_FORCE_PATH_STYLE`` (``0``/``false`` = virtual-hosted), else path.
        access_key_id, secret_access_key, session_token: explicit credentials (kept out of repr).
        timeout_s: limit for one whole request; a stalled request is abandoned and retried.
        connect_timeout_s: limit for opening a connection.
        max_attempts: tries per request (1 = no retry) before :class:`RemoteError`.
        backoff_base_s, backoff_max_s: the retry delay before try k+1 is uniform in
            ``[0, min(backoff_max_s, backoff_base_s * 2**k)]`` (exponential backoff, full jitter).
    """

    endpoint: str | None = None
    region: str | None = None
    profile: str | None = None
    allow_http: bool | None = None
    path_style: bool | None = None
    access_key_id: str | None = dataclasses.field(default=None, repr=False)
    secret_access_key: str | None = dataclasses.field(default=None, repr=False)
    session_token: str | None = dataclasses.field(default=None, repr=False)
    timeout_s: float = 60.0
    connect_timeout_s: float = 5.0
    max_attempts: int = 8
    backoff_base_s: float = 0.05
    backoff_max_s: float = 5.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigError(f"max_attempts must be >= 1, got {self.max_attempts}")
        for name in ("timeout_s", "connect_timeout_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0 seconds, got {getattr(self, name)}")
        if self.backoff_base_s < 0 or self.backoff_max_s < 0:
            raise ConfigError("backoff_base_s and backoff_max_s must be >= 0")

    @classmethod
    def from_kwargs(cls, options: dict[str, Any]) -> S3Options:
        """Pops the S3 knobs out of a loader/pack kwargs dict (``s3=S3Options(...)`` also works)."""
        given = options.pop("s3", None)
        if given is not None and not isinstance(given, S3Options):
            raise ConfigError(f"s3= must be an S3Options, got {type(given).__name__}")
        fields = {f.name for f in dataclasses.fields(cls)}
        picked = {k: options.pop(k) for k in list(options) if k in fields}
        if given is None:
            return cls(**picked)
        return dataclasses.replace(given, **picked) if picked else given


def split_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` -> ``("bucket", "some/prefix")``."""
    if not url.startswith("s3://"):
        raise ConfigError(f"not an s3:// URL: {url!r}")
    bucket, _, key = url[5:].partition("/")
    if not bucket:
        raise ConfigError(f"s3 URL without a bucket: {url!r} (expected s3://bucket/prefix/)")
    return bucket, key


def _path_style(given: bool | None, env: str | None) -> bool:
    """Path-style addressing unless ``path_style=False`` or ``MX8_S3_FORCE_PATH_STYLE`` says 0."""
    if given is not None:
        return bool(given)
    if env is None or not env.strip():
        return True
    v = env.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"invalid MX8_S3_FORCE_PATH_STYLE={env!r} (expected 1/true: path-style "
                      "requests, or 0/false: virtual-hosted)")


def _profile_settings(profile: str | None) -> dict[str, str]:
    """Reads a profile from the standard AWS credentials and config files (no SDK needed)."""
    name = profile or os.environ.get("AWS_PROFILE") or "default"
    out: dict[str, str] = {}
    paths = [
        (os.environ.get("AWS_CONFIG_FILE", "~/.aws/config"),
         name if name == "default" else f"profile {name}"),
        (os.environ.get("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials"), name),
    ]
    found = False
    for path, section in paths:
        parser = configparser.RawConfigParser()
        try:
            parser.read(os.path.expanduser(path))
        except configparser.Error as e:
            raise ConfigError(f"cannot parse AWS config file {path}: {e}") from e
        if parser.has_section(section):
            found = True
            out.update({k: v.strip() for k, v in parser.items(section)})
    if profile is not None and not found:
        raise ConfigError(f"AWS profile {profile!r} not found in ~/.aws/config or "
                          "~/.aws/credentials (set AWS_CONFIG_FILE / AWS_SHARED_CREDENTIALS_FILE)")
    return out


def _status(exc: BaseException) -> int | None:
    m = _STATUS_RE.search(str(exc))
    return int(m.group(1)) if m else None


def _retryable(exc: BaseException) -> bool:
    """5xx, 408/429, timeouts and connection errors are transient; other 4xx are not."""
    from obstore import exceptions as ox

    if isinstance(exc, ox.GenericError):
        status = _status(exc)
        return status is None or status >= 500 or status in _RETRY_4XX
    return isinstance(exc, (ConnectionError, TimeoutError))


def _short(exc: BaseException) -> str:
    # obstore appends a multi-line "Debug source" dump; the first line says what happened.
    return str(exc).split("\n", 1)[0][:300]


class ObjectStore:
    """One bucket. Thread-safe; picklable (the client is rebuilt in the new process).

    Attributes:
        bucket: the bucket name.
        retries: how many retries were made so far (all calls, all threads).
    """

    def __init__(self, bucket: str, *, options: S3Options | None = None) -> None:
        self.bucket = bucket
        self.options = options or S3Options()
        self.retries = 0
        self._lock = threading.Lock()
        self._client: Any = None
        self._config = self._resolve_config()

    # -- configuration ---------------------------------------------------------------------------

    def _resolve_config(self) -> dict[str, Any]:
        o, env = self.options, os.environ
        has_env_keys = bool(env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"))
        prof = _profile_settings(o.profile) if (o.profile or not has_env_keys
                                                or env.get("AWS_PROFILE")) else {}
        endpoint = (o.endpoint or env.get("HEADRACE_S3_ENDPOINT") or env.get("MX8_S3_ENDPOINT_URL")
                    or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
                    or prof.get("endpoint_url"))
        region = (o.region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
                  or prof.get("region") or "us-east-1")
        cfg: dict[str, Any] = {"region": region}
        if endpoint:
            parts = urlsplit(endpoint)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ConfigError(f"S3 endpoint must be an http(s):// URL, got {endpoint!r}")
            allow = o.allow_http
            if allow is None:
                allow = parts.hostname in _LOOPBACK
            if parts.scheme == "http" and not allow:
                raise ConfigError(f"S3 endpoint {endpoint!r} is plain http on a non-loopback host;"
                                  " pass allow_http=True if that is intended")
            cfg["endpoint"] = endpoint.rstrip("/")
            cfg["_allow_http"] = bool(allow)
        if not _path_style(o.path_style, env.get("MX8_S3_FORCE_PATH_STYLE")):
            cfg["virtual_hosted_style_request"] = True
            if endpoint:  # the SDKs' virtual-hosted form of a custom endpoint
                parts = urlsplit(cfg["endpoint"])
                cfg["endpoint"] = parts._replace(netloc=f"{self.bucket}.{parts.netloc}").geturl()
        # Explicit keys, then a profile chosen explicitly, then env, then the default profile.
        if o.access_key_id and o.secret_access_key:
            keys = (o.access_key_id, o.secret_access_key, o.session_token)
        elif (o.profile or env.get("AWS_PROFILE")) and prof.get("aws_access_key_id"):
            keys = (prof["aws_access_key_id"], prof.get("aws_secret_access_key", ""),
                    prof.get("aws_session_token"))
        elif has_env_keys:
            keys = (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"],
                    env.get("AWS_SESSION_TOKEN"))
        elif prof.get("aws_access_key_id"):
            keys = (prof["aws_access_key_id"], prof.get("aws_secret_access_key", ""),
                    prof.get("aws_session_token"))
        else:
            keys = None  # obstore falls back to instance metadata / web identity
        if keys is not None:
            cfg["access_key_id"], cfg["secret_access_key"] = keys[0], keys[1]
            if keys[2]:
                cfg["session_token"] = keys[2]
        return cfg

    @property
    def endpoint(self) -> str | None:
        return self._config.get("endpoint")

    def _store(self) -> Any:
        client = self._client
        if client is None:
            with self._lock:
                if self._client is None:
                    from obstore.store import S3Store

                    cfg = dict(self._config)
                    allow_http = cfg.pop("_allow_http", False)
                    self._client = S3Store(
                        self.bucket, config=cfg,  # type: ignore[arg-type]
                        client_options={
                            "allow_http": allow_http,
                            "timeout": timedelta(seconds=self.options.timeout_s),
                            "connect_timeout": timedelta(seconds=self.options.connect_timeout_s),
                        },
                        retry_config={"max_retries": 0})
                client = self._client
        return client

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_client"] = None
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    # -- the retry loop --------------------------------------------------------------------------

    def call(self, what: str, key: str, fn: Callable[[Any], T]) -> T:
        """Runs ``fn(client)`` with the retry policy; ``what`` and ``key`` name it in errors."""
        from obstore import exceptions as ox

        o = self.options
        for attempt in range(1, o.max_attempts + 1):
            try:
                return fn(self._store())
            except (ox.NotFoundError, FileNotFoundError) as e:
                raise ObjectNotFoundError(f"{what} {self.url(key)}: no such key", key=key) from e
            except Exception as e:
                if not _retryable(e):
                    raise RemoteError(f"{what} {self.url(key)} failed: {_short(e)}",
                                      key=key) from e
                if attempt == o.max_attempts:
                    err = RemoteError(
                        f"{what} {self.url(key)} failed after {attempt} attempts: {_short(e)}"
                        " (raise max_attempts/timeout_s, or check the endpoint)", key=key)
                    raise err from e
            with self._lock:
                self.retries += 1
            time.sleep(random.uniform(0.0, min(o.backoff_max_s, o.backoff_base_s * 2 ** attempt)))
        raise AssertionError("unreachable")

    # -- operations --------------------------------------------------------------------------------

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """Every object under ``prefix`` (recursively), in the server's (lexicographic) order.

        A listing page that fails is retried; the whole listing is restarted only if the
        iterator itself breaks, so a long listing survives transient faults.
        """
        import obstore

        def pages(client: Any) -> list[list[Any]]:
            return [list(p) for p in obstore.list(client, prefix=prefix or None, chunk_size=1000)]

        for page in self.call("LIST", prefix, pages):
            for m in page:
                yield _info(m)

    def head(self, key: str) -> ObjectInfo:
        import obstore

        return _info(self.call("HEAD", key, lambda c: obstore.head(c, key)))

    def get(self, key: str) -> tuple[bytes, ObjectInfo]:
        """The whole object and what the server said about it (size, ETag) when it sent it."""
        import obstore
        from obstore import exceptions as ox

        def fetch(client: Any) -> tuple[bytes, ObjectInfo]:
            # Asked as the range "from byte 0": the answer then states the object's size in
            # Content-Range apart from the body's Content-Length, so a body cut short together
            # with its Content-Length (a proxy, a dropped connection) is still seen as short.
            try:
                res = obstore.get(client, key, options={"range": {"offset": 0}})
            except ox.GenericError as e:
                if _status(e) != 416:
                    raise
                res = obstore.get(client, key)  # an empty object has no byte 0 to range from
            data = bytes(res.bytes())
            info = _info(res.meta)
            if len(data) != info.size:
                raise ConnectionError(f"short read: {len(data)} of {info.size} bytes")
            return data, info

        return self.call("GET", key, fetch)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of the object; a short answer is retried like a dropped one."""
        import obstore

        def fetch(client: Any) -> bytes:
            data = bytes(obstore.get_range(client, key, start=start, end=end))
            if len(data) != end - start:
                raise ConnectionError(f"short read: {len(data)} of {end - start} bytes")
            return data

        return self.call(f"GET bytes={start}-{end - 1}", key, fetch)

    def put(self, key: str, data: bytes | memoryview | pathlib.Path) -> None:
        """Writes one object atomically (large files go up as a multipart upload)."""
        import obstore

        self.call("PUT", key, lambda c: obstore.put(c, key, data))

    def delete(self, keys: Sequence[str]) -> None:
        import obstore

        for i in range(0, len(keys), 1000):
            part = list(keys[i:i + 1000])

            def delete(client: Any, part: list[str] = part) -> None:
                obstore.delete(client, part)

            self.call("DELETE", part[0], delete)


def _info(meta: Any) -> ObjectInfo:
    mtime = meta.get("last_modified")
    return ObjectInfo(key=meta["path"], size=int(meta["size"]), etag=meta.get("e_tag") or "",
                      mtime_ns=int(mtime.timestamp() * 1e9) if mtime is not None else 0)
