-- spec/batteries.lua: runs a chunk of Lua as a script's top level in the
-- real binary and returns what it returned (through JSON on stdout), for
-- the specs of mp.crypto, mp.re, mp.jwt and mp.template, whose vectors
-- must run where the code ships (and under the sanitizers with it).
--
--   local run = require("spec.batteries").run
--   local r = run([[ return { mp.crypto.sha1("abc", "hex") } ]])
local H = require "spec.helper"
local cjson = require "cjson"

local B = {}

--- body: Lua with `mp` and `cjson` in scope, ending in `return value`.
--- opts.files: { [name] = text } written beside the script first (its
--- folder is the script's, so relative paths work). Raises with the
--- script's stderr if it failed.
function B.run(body, opts)
  opts = opts or {}
  local dir = H.tmpdir()
  for name, text in pairs(opts.files or {}) do
    local sub = name:match("^(.*)/[^/]+$")
    if sub then os.execute("mkdir -p '" .. dir .. "/" .. sub .. "'") end
    H.write_file(dir .. "/" .. name, text)
  end
  local path = dir .. "/t.lua"
  H.write_file(path, "local mp = require 'moonport'\n" ..
    "local cjson = require 'cjson'\n" ..
    "local function main()\n" .. body .. "\nend\n" ..
    "local ok, r = xpcall(main, debug.traceback)\n" ..
    "if not ok then io.stderr:write(r, '\\n') os.exit(1) end\n" ..
    "io.stdout:write(cjson.encode(r)) io.stdout:flush() os.exit(0)\n")
  local st, out, err = H.run({ path }, { env = opts.env })
  assert(st == 0, "script failed: " .. tostring(err))
  return cjson.decode(out), dir
end

return B
