"""The pieces behind `frink-mlx chat` and `frink-mlx generate` (their entry points: command.py).

    command.py  `chat_command` and `generate_command`: pick the daemon or load in process
    common.py   ChatParams, Stats (tokens/s), the ChatModel protocol both sides speak
    daemon.py   the daemon over HTTP: streamed chat and completions, transport
                failures and error envelopes turned into FrinkErrors (finding the
                daemon, /health: ../local_daemon.py)
    local.py    a generation built in this process, streamed, stopped by Ctrl-C
    session.py  the conversation (history, system prompt, /save)
    prompt.py   the line read at the prompt, which never loses a Ctrl-C
    repl.py     the read-answer loop and its slash commands

Nothing here is imported by the daemon; MLX is imported only by local.py, and
only when the model is loaded in process.
"""
