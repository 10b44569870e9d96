-- The script contrib/moonport.service runs (/etc/moonport/app.lua in the
-- Debian package): replace it with your application, then
-- `systemctl reload moonport`. See /usr/share/doc/moonport/API.md.
local mp = require "moonport"

mp.http {
  address = "127.0.0.1",
  port = tonumber(os.getenv("MOONPORT_PORT")) or 8080,
  on_request = function(req, res)
    res:header("Content-Type", "text/plain"):send("Hello from moonport\n")
  end,
}
