-- spec/js.lua: runs the Node.js scripts of spec/node/ (third-party clients:
-- the npm ws package, node's http, playwright-core with Debian's chromium)
-- and reads what they print, one JSON object a line.
--
--   local JS = require "spec.js"
--   local rows = JS.run("ws_cases.js", { port, "echo" })   -- asserts it ran
--   for _, r in ipairs(rows) do ... end
--
-- The scripts' packages come from spec/node/node_modules, which
-- scripts/setup installs (npm ci) from spec/node/package-lock.json.
local H = require "spec.helper"
local cjson = require "cjson"

local JS = {}

JS.node = "/usr/bin/node"
JS.dir = H.root .. "/spec/node"

-- The scripts' environment: SPEC_SCALE stretches their deadlines as H.T
-- does the specs'.
JS.env = { SPEC_SCALE = H.scale }

--- Why the scripts can't run here, or nil.
function JS.missing()
  if not H.exists(JS.node) then return "no " .. JS.node .. " (scripts/setup installs nodejs)" end
  for _, m in ipairs { "ws", "playwright-core" } do
    if not H.exists(JS.dir .. "/node_modules/" .. m .. "/package.json") then
      return "no spec/node/node_modules/" .. m .. " (scripts/setup runs npm ci there)"
    end
  end
  return nil
end

--- Runs spec/node/<script> with `args`; waits at most `timeout` seconds
--- (stretched for sanitizer builds). Returns the decoded JSON lines, the
--- exit status, stdout and stderr. Does not judge them.
function JS.exec(script, args, timeout)
  local argv = { JS.node, JS.dir .. "/" .. script }
  for _, a in ipairs(args or {}) do argv[#argv + 1] = tostring(a) end
  local p = H.spawn(argv, { env = JS.env })
  p.sanitizer_checked = true
  local st = p:wait_exit(H.T(timeout or 20))
  if not st then
    p:kill(H.SIGKILL)
    p:wait_exit(5)
  end
  local rows = {}
  for _, line in ipairs(H.lines(p:stdout())) do
    if line:sub(1, 1) == "{" then
      local ok, v = pcall(cjson.decode, line)
      if ok then rows[#rows + 1] = v end
    end
  end
  return rows, st, p:stdout(), p:stderr()
end

--- JS.exec, then asserts the script finished ({"done":true} last, exit 0).
--- `srv` (optional) adds the server's output to a failure message.
function JS.run(script, args, timeout, srv)
  local rows, st, out, err = JS.exec(script, args, timeout)
  local last = rows[#rows]
  if st ~= 0 or not last or last.done ~= true then
    error(("node %s %s: %s\n--- its stdout:\n%s\n--- its stderr:\n%s%s"):format(
      script, table.concat(args or {}, " "),
      st and ("exit status " .. st) or "did not finish in time",
      out:sub(-3000), err:sub(-3000),
      srv and ("\n--- server: " .. srv:describe()) or ""), 2)
  end
  rows[#rows] = nil
  return rows
end

--- The keys of `t` (a decoded JSON object) as strings, sorted.
function JS.keys(t)
  local k = {}
  for key in pairs(t) do k[#k + 1] = tostring(key) end
  table.sort(k)
  return k
end

--- The first row whose field `k` equals `v`.
function JS.find(rows, k, v)
  for _, r in ipairs(rows) do
    if r[k] == v then return r end
  end
  return nil
end

return JS
