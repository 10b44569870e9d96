-- Spec: docs/GUIDE.md, run as written. Blocks are taken in order: a
-- block whose first line is "-- file: NAME" (or "<!-- file: NAME -->") is
-- saved as NAME in a fresh folder; in a sh block, "$ moonport ... app.lua"
-- (re)starts the server there, any other "$" line runs with /bin/sh in
-- that folder, and the lines after it must be exactly what it prints
-- (stdout, then stderr). "$ export NAME=VALUE" sets NAME (VALUE as sh
-- expands it) for every later command and server, as in one shell
-- session. Port 8080 is swapped for a free port throughout, and the
-- guide's DATABASE_URL for a PostgreSQL the spec starts
-- (scripts/pg-test-server, or the one MOONPORT_TEST_PG_* names).
local H = require "spec.helper"
local lfs = require "lfs"

local GUIDE_DB = "postgres://short:secret@127.0.0.1:5432/short"
local PG_SCRIPT = H.root .. "/scripts/pg-test-server"

-- a PostgreSQL for step 8: its URL, and what stops it (or nil)
local function start_pg()
  local env = {}
  if os.getenv("MOONPORT_TEST_PG_PORT") then
    for _, k in ipairs { "PORT", "USER", "PASSWORD", "DB" } do env[k] = os.getenv("MOONPORT_TEST_PG_" .. k) end
  else
    local st, out, err = H.exec({ "/bin/bash", PG_SCRIPT, "start" }, { timeout = H.T(120) })
    assert(st == 0, "scripts/pg-test-server start failed: " .. tostring(out) .. tostring(err))
    for k, v in out:gmatch("MOONPORT_TEST_PG_(%u+)=([^\n]*)") do env[k] = v end
  end
  local url = ("postgres://%s:%s@127.0.0.1:%s/%s"):format(env.USER, env.PASSWORD, env.PORT, env.DB)
  if os.getenv("MOONPORT_TEST_PG_PORT") then
    -- a server shared with other runs (CI's: make test, then the
    -- sanitizer runs): the guide's table from an earlier run goes first
    local st, out, err = H.exec({ "/usr/bin/psql", "-q", url, "-c", "DROP TABLE IF EXISTS clicks" })
    assert(st == 0, "psql: " .. tostring(out) .. tostring(err))
  end
  return url, env.DIR and not os.getenv("MOONPORT_TEST_PG_PORT") and function()
    H.exec({ "/bin/bash", PG_SCRIPT, "stop", env.DIR }, { timeout = H.T(60) })
  end
end

local function quote(v) return "'" .. v:gsub("'", "'\\''") .. "'" end

-- "export A='x'; export B='y'; " for the names set so far
local function exports(env)
  local out = {}
  for _, kv in ipairs(env) do out[#out + 1] = "export " .. kv[1] .. "=" .. quote(kv[2]) .. "; " end
  return table.concat(out)
end

local function blocks(text)
  local out = {}
  for lang, body in text:gmatch("\n```(%w+)\n(.-)\n```") do out[#out + 1] = { lang = lang, body = body } end
  return out
end

local function mkdirs(path)
  local at = ""
  for part in path:gmatch("[^/]+") do
    at = at .. "/" .. part
    lfs.mkdir(at)
  end
end

describe("docs/GUIDE.md", function()
  local db_url, stop_pg
  setup(function() db_url, stop_pg = start_pg() end)
  teardown(function() if stop_pg then stop_pg() end end)
  after_each(H.cleanup)

  it("every code block runs as written and prints what the guide shows", function()
    local text = assert(H.read_file(H.root .. "/docs/GUIDE.md"))
    local dir = H.tmpdir()
    local port = tostring(H.free_port())
    local srv
    local ran, saved = 0, 0
    local env = {}
    for _, b in ipairs(blocks(text)) do
      local body = b.body:gsub("8080", port):gsub(GUIDE_DB:gsub("%p", "%%%0"), (db_url:gsub("%%", "%%%%")))
      local name = body:match("^%-%- file: (%S+)\n") or body:match("^<!%-%- file: (%S+) %-%->\n")
      if name then
        local path = dir .. "/" .. name
        mkdirs(path:match("^(.*)/[^/]*$"))
        H.write_file(path, body:gsub("^[^\n]*\n", "", 1) .. "\n")
        saved = saved + 1
      elseif b.lang == "sh" then
        local cmds, cur = {}, nil
        for line in (body .. "\n"):gmatch("([^\n]*)\n") do
          local cmd = line:match("^%$ (.*)$")
          if cmd then
            cur = { cmd = cmd, want = {} }
            cmds[#cmds + 1] = cur
          else
            cur.want[#cur.want + 1] = line
          end
        end
        for _, c in ipairs(cmds) do
          local args = c.cmd:match("^moonport (.*app%.lua)$")
          local var, value = c.cmd:match("^export ([%w_]+)=(.*)$")
          if var then
            local _, out = H.exec({ "/bin/sh", "-c", 'cd "$1" && ' .. exports(env) .. var .. "=" .. value ..
              '; printf %s "$' .. var .. '"', "sh", dir })
            assert.truthy(out ~= "", "$ " .. c.cmd)
            env[#env + 1] = { var, out }
          elseif args and not args:find("--check", 1, true) then
            if srv then assert.equal(0, srv:stop()) end
            local argv = { "/bin/sh", "-c", 'cd "$1" && shift && ' .. exports(env) .. 'exec "$@"', "sh", dir, H.bin }
            for a in args:gmatch("%S+") do argv[#argv + 1] = a end
            srv = H.spawn(argv)
            H.wait_for(function()
              if not srv:alive() then error("the guide's server exited: " .. srv:describe(), 0) end
              return srv:listens_on(tonumber(port))
            end, H.T(10), function() return srv:describe() end)
          else
            local sh = c.cmd:gsub("^moonport ", H.bin .. " ")
            local _, out, err = H.exec({ "/bin/sh", "-c", 'cd "$1" && ' .. exports(env) .. sh .. " 2>&1", "sh", dir },
              { timeout = H.T(20) })
            local want = table.concat(c.want, "\n")
            if #c.want > 0 then want = want .. "\n" end
            assert.equal(want, out .. err, "$ " .. c.cmd)
          end
          ran = ran + 1
        end
      end
    end
    assert.is_true(saved >= 14 and ran >= 40, ("saved %d files, ran %d commands"):format(saved, ran))
    if srv then assert.equal(0, srv:stop()) end
  end)
end)
