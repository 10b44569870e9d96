-- SPDX-License-Identifier: MIT
-- r:cmd(...) of mp.redis clients (src/lx/lx_redis.c holds the rest).
-- With a callback as its last argument it sends and returns at once;
-- without, it waits in its coroutine for the reply, `nil, err` on failure.
-- A table first, r:cmd({ timeout = ms }, name, ...), is the command's
-- options; the C half reads it (check, arm, send).
local core = require("moonport.core")
local C = core.redis -- check, arm, send: filled by lx_redis_open
local check, arm, send = C.check, C.arm, C.send
local yield, TOKEN = core.raw_yield, core.wait_token
local select, type = select, type

return function(self, ...)
  local n = select("#", ...)
  if n > 0 and type(select(n, ...)) == "function" then
    return send(self, ...)
  end
  local ok, err = check(self, ...)
  if not ok then return nil, err end
  return yield(TOKEN, arm, self, ...)
end
