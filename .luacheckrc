-- luacheck (Debian lua-check) over the Lua moonport runs and its specs;
-- `make lint`, part of `make test`.
std = "luajit"
-- handlers and callbacks take (req, res), (conn, data), ... and many use
-- only some of them: an unused argument is the API's shape, not a mistake
unused_args = false
max_line_length = 120
exclude_files = { "spec/node/node_modules/**", "build/**" }

files["spec/**"] = { std = "+busted", max_line_length = false }
files["bench/**"] = { max_line_length = false }
files["examples/**"] = { max_line_length = false }
-- scripts moonport runs in the specs: some are broken or odd on purpose
exclude_files[#exclude_files + 1] = "spec/fixtures/*syntax_error*.lua"
files["spec/fixtures/**"] = { allow_defined = true, ignore = { "131", "232", "412" } }
files["bench/shared_loop.lua"] = { read_globals = { "ngx" } }
files["bench/limit_loop.lua"] = { read_globals = { "ngx" } }
-- wrk's script API
files["bench/wrk_*.lua"] = { globals = { "wrk", "setup", "init", "delay", "request", "response", "done" } }
