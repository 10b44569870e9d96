-- SPDX-License-Identifier: MIT
-- The __index and __newindex of moonport's userdata classes (conn, ws, sse,
-- ...), made by lx_meta_env (src/lx/lx_conn.c) for each class's methods.
--
-- conn.env lives in the userdata's environment table, made on first use, so
-- an idle connection that never touches it pays nothing. The look-up is Lua
-- so that LuaJIT compiles method calls into the caller's trace.
local core = require("moonport.core")
local NOENV = core.noenv -- the shared placeholder environment
local getfenv, setfenv = debug.getfenv, debug.setfenv
local error, tostring, type = error, tostring, type

return function(methods)
  local function index(self, k)
    local m = methods[k]
    if m ~= nil then return m end
    if k == "env" then
      local e = getfenv(self)
      if e == NOENV then
        e = {}
        setfenv(self, e)
      end
      return e
    end
  end
  local function newindex(self, k, v)
    if k == "env" and type(v) == "table" then
      setfenv(self, v)
      return
    end
    error(tostring(self) .. " has no field '" .. tostring(k) ..
          "' to set (keep state in its .env table)", 2)
  end
  return index, newindex
end
