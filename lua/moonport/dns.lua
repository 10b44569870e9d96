-- SPDX-License-Identifier: MIT
-- mp.resolve(host [, { family = 4 | 6, timeout = ms }]): the addresses of
-- a host name as strings ({ "127.0.0.1", ... }), or nil and why ("no such
-- host", "timeout", ...). The lookup runs on the lane's c-ares resolver
-- (src/lx/lx_dns.c) and waits only the calling coroutine.
local core = require("moonport.core")
local C = core.dns -- check, arm: filled by lx_dns_open
local check, arm = C.check, C.arm
local yield, TOKEN = core.raw_yield, core.wait_token
local type = type

return function(host, opts)
  local family, timeout = 0, 0
  if opts ~= nil then
    if type(opts) ~= "table" then
      error("mp.resolve: opts must be a table", 2)
    end
    family = opts.family or 0
    timeout = opts.timeout or 0
  end
  check(host, family, timeout)
  return yield(TOKEN, arm, host, family, timeout)
end
