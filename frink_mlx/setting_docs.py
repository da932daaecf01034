"""What each setting means: the one table `frink-mlx serve`'s flags and README.md's
settings section are built from (cli_flags.py).

Why a module of its own: the table is documentation kept beside the code, one row
per `Settings` field (settings.py), and a test checks every field has a row, a flag
and a README line. Rows follow the fields' order and groups.
"""

from __future__ import annotations

from typing import NamedTuple


class SettingDoc(NamedTuple):
    """One row of the flag table (see the module docstring)."""

    help: str                      # one line; says what an unset (None) value means
    flags: tuple[str, ...] = ()    # flag names when not `--field-name`; the first is shown
    default: str = ""              # the default as shown, when it is computed at run time


SETTING_DOCS: dict[str, SettingDoc] = {
    # --- network ---
    "host": SettingDoc("address to bind; a non-loopback address needs an API key"),
    "port": SettingDoc("TCP port; 0 picks a free one (the ready line names it)"),
    "api_key": SettingDoc("API key clients must send (Bearer or x-api-key); unset: none "
                          "unless a key file exists"),
    "api_key_file": SettingDoc("file holding the API key (mode 0600); unset: the "
                               "file api_key in config_dir when it exists"),
    "allowed_hosts": SettingDoc("extra Host header names accepted beyond loopback ones "
                                "(repeat the flag; env: comma-separated)", ("--allowed-host",)),
    "cors_origins": SettingDoc("exact browser origins allowed by CORS (repeat the flag; env: "
                               "comma-separated)", ("--cors-origin",)),
    "max_body_bytes": SettingDoc("request bodies larger than this get 413"),
    "header_timeout_s": SettingDoc("the request line and headers must arrive within this many "
                                   "seconds, else 408 or the connection is closed"),
    "body_timeout_s": SettingDoc("the whole request body must arrive within this many seconds, "
                                 "else 408"),
    "idle_timeout_s": SettingDoc("a keep-alive connection idle this many seconds is closed"),
    "send_timeout_s": SettingDoc("a response the client reads nothing of for this many seconds "
                                 "is aborted (its generation stopped; logged 499); a slow but "
                                 "steady reader is never cut"),
    "max_connections": SettingDoc("open connections at most; a new one past it is answered 503 "
                                  "before anything of it is read (the open-files limit is "
                                  "raised to fit)"),
    "ssl_certfile": SettingDoc("serve HTTPS with this certificate chain (PEM; with "
                               "ssl_keyfile); unset: plain HTTP"),
    "ssl_keyfile": SettingDoc("the private key of ssl_certfile (PEM)"),
    "strict_fields": SettingDoc("refuse unknown request fields by name (400) instead of "
                                "accepting and reporting them (x-frink-ignored-fields)"),
    "max_images": SettingDoc("most image parts one request may carry to a vision model (400 "
                             "naming the part beyond it)"),
    "max_image_bytes": SettingDoc("most decoded bytes of one image (400 naming the part)"),
    "max_image_pixels": SettingDoc("most pixels (width x height) of one image, checked before "
                                   "it is decoded (400 naming the part)"),
    "fetch_image_urls": SettingDoc("fetch http(s) image URLs for vision models (10 s, "
                                   "max_image_bytes; off: such a part is a 400 naming it, so "
                                   "a client cannot make the daemon reach other hosts)"),
    "refuse_images": SettingDoc("refuse image parts by name (400) instead of replacing each "
                                "with a short placeholder text (x-frink-images-omitted)"),
    # --- models ---
    "models_path": SettingDoc("models.toml to use (env also FRINK_MLX_MODELS); unset: "
                              "~/.config/frink-mlx/models.toml, then the packaged one",
                              ("--models",)),
    "config_dir": SettingDoc("where the user's key file lives",
                             default="$XDG_CONFIG_HOME/frink-mlx or ~/.config/frink-mlx"),
    "cache_dir": SettingDoc("where converted (GGUF-imported) checkpoints are cached",
                            default="~/Library/Caches/frink-mlx on macOS, else "
                                    "$XDG_CACHE_HOME/frink-mlx or ~/.cache/frink-mlx"),
    "default_model": SettingDoc("model to load at start; unset: the registry's `default`",
                                ("--model",)),
    "fallback": SettingDoc("serve unknown model names with the default model (embeddings: the "
                           "embedding model); unset: on for a loopback-only daemon"),
    "auto_swap": SettingDoc("a request naming another registry entry swaps to it "
                            "(--no-auto-swap answers 409 instead)"),
    "min_generation_s": SettingDoc("a loaded model lives at least this many seconds before "
                                   "a swap may replace it"),
    "keep_alive_s": SettingDoc("unload after this many idle seconds, reload on the next "
                               "request; unset: never", ("--keep-alive", "--keep-alive-s")),
    "max_resident_models": SettingDoc("models kept loaded at once; 0: as many as the memory "
                                      "budget holds (1: the classic single-model swap)"),
    "evict_wait_s": SettingDoc("a load that needs memory held by busy models waits this long "
                               "for them to go idle, then answers 503 with Retry-After"),
    "dequantize": SettingDoc("dequantize quantized weights to float32 on the CPU backend; "
                             "unset: the model's entry, else where memory allows"),
    "use_openblas": SettingDoc("re-execute once with the system OpenBLAS preloaded (Linux)",
                               ("--openblas",)),
    "hf_offline": SettingDoc("resolve Hugging Face repo ids from the local cache only, never "
                             "the network (env also HF_HUB_OFFLINE)"),
    "hf_endpoint": SettingDoc("Hugging Face Hub endpoint (env also HF_ENDPOINT); unset: "
                              "huggingface_hub's default"),
    "hf_cache_dir": SettingDoc("Hugging Face cache directory (env also HF_HUB_CACHE / "
                               "$HF_HOME/hub); unset: huggingface_hub's default"),
    "ollama_models": SettingDoc("the Ollama store that `ollama:NAME[:TAG]` sources read "
                                "(env also OLLAMA_MODELS)", default="~/.ollama/models"),
    # --- engine ---
    "batching": SettingDoc("continuous batching; --no-batching decodes one request at a time"),
    "max_batch": SettingDoc("sequences decoded together at most"),
    "block_size": SettingDoc("tokens per KV block: the prefix cache reuses a shared prefix "
                             "rounded down to it"),
    "prefill_chunk_tokens": SettingDoc("prompt tokens prefilled per step while other streams "
                                       "decode"),
    "idle_prefill_tokens": SettingDoc("prompt tokens prefilled in a step that decodes nobody"),
    "shared_prefill_tokens": SettingDoc("prompt tokens prefilled per step while another "
                                        "resident model's engine runs (bounds its streams' "
                                        "inter-token gap; the least a step that only "
                                        "prefills takes, engine/turns.py)"),
    "admission_window_ms": SettingDoc("an idle engine gathers a burst of requests this long "
                                      "into one step"),
    "pipeline": SettingDoc("dispatch decode step t+1 before reading step t; unset: on Metal "
                           "only"),
    "cpu_matmul_parts": SettingDoc("CPU backend: split each matmul over this many MLX streams; "
                                   "unset: one per usable core (at most 8); 1 turns it off"),
    "kv_budget_bytes": SettingDoc("device memory budget for weights and KV; unset: measured "
                                  "(Metal's working set or physical RAM)"),
    "memory_headroom_fraction": SettingDoc("fraction of the budget kept free when sizing the "
                                           "KV pool"),
    "max_kv_pool_bytes": SettingDoc("cap on one model's KV pool, however much memory is free"),
    "kv_bits": SettingDoc("store KV blocks in 8 or 4 bits (MLX affine quantization in groups of "
                          "64 features, 32 where the head dim needs it): head dim 64 holds 3.6x "
                          "or 6.4x the float32 context in the same memory (1.9x or 3.6x the "
                          "float16); greedy output drifts from float KV's; a models.toml "
                          "entry's `kv_bits` wins; unset: the model's float type"),
    "kv_disk_dir": SettingDoc("where the prefix cache's SSD tier keeps KV blocks (they survive "
                              "restarts, swaps and evictions)",
                              default="cache_dir/kv: ~/Library/Caches/frink-mlx/kv on macOS, "
                                      "else $XDG_CACHE_HOME/frink-mlx/kv or ~/.cache/frink-mlx/kv"),
    "kv_disk_bytes": SettingDoc("byte budget of the SSD tier (least recently used blocks go "
                                "first); 0 turns the tier off"),
    "max_queue": SettingDoc("requests waiting beyond this many get 503 with Retry-After"),
    "queue_timeout_s": SettingDoc("a request waiting this long for KV room gets 503"),
    "speculative": SettingDoc("speculative decoding inside the batch: prompt lookup, and the "
                              "draft model of an entry naming `draft` (not loaded when off; "
                              "greedy output unchanged); requests opt out with "
                              "`speculative: false`"),
    "spec_max_draft": SettingDoc("most tokens one row drafts per step"),
    "spec_ngram": SettingDoc("longest suffix n-gram looked up in the row's context"),
    "spec_max_rows": SettingDoc("a step decoding more rows than this does not speculate"),
    "spec_draft_rows": SettingDoc("rows the draft model keeps KV for: its pool holds this many"
                                  " full contexts"),
    # --- several machines (README "Several Macs") ---
    "distributed_hostfile": SettingDoc("serve one model over a group of machines: the MLX hostfile "
                                       "(env also MLX_HOSTFILE under mlx.launch)", ("--distributed",)),
    "distributed_rank": SettingDoc("this machine's rank in the hostfile; 0 serves HTTP, the "
                                   "others follow (env also MLX_RANK)", ("--rank",)),
    "distributed_backend": SettingDoc("MLX distributed backend: ring, jaccl, mpi or any"),
    "distributed_split": SettingDoc("how a model is split over the group: tensor (each rank a "
                                    "slice of every layer), pipeline (each rank a run of "
                                    "layers), or auto (tensor where the model allows, else "
                                    "pipeline); ranks set differently load nothing"),
    "distributed_timeout_s": SettingDoc("a step's collectives taking longer than this mark the "
                                        "group lost"),
    "distributed_load_timeout_s": SettingDoc("how long every rank may take to load a model"),
    "distributed_ping_s": SettingDoc("rank 0 checks an idle group this often"),
    "distributed_exit_after_lost_s": SettingDoc("rank 0 exits 1 this long after losing the group, "
                                                "so the service manager restarts it; unset: stay "
                                                "up answering 503"),
    # --- lifecycle ---
    "drain_timeout_s": SettingDoc("on SIGTERM, seconds in-flight requests may take to finish"),
    "log_level": SettingDoc("debug, info, warning, error or critical"),
    "access_log": SettingDoc("one JSON access-log line per request (on stderr, or in "
                             "access_log_file)"),
    "access_log_file": SettingDoc("write access-log lines to this file, rotated by size, instead "
                                  "of stderr; unset: stderr (`service install` on macOS sets "
                                  "~/Library/Logs/frink-mlx/access.log)"),
    "access_log_max_bytes": SettingDoc("the access-log file is rotated past this size"),
    "access_log_backups": SettingDoc("rotated access-log files kept (access.log.1 ... .N)"),
    "embed_batch_size": SettingDoc("texts embedded together at most"),
}
