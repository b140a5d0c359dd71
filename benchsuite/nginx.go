package benchsuite

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// nginxConfig is nginx as a plain streaming reverse proxy: 2 workers,
// upstream keepalive, no response buffering, request bodies streamed to
// the engine as they arrive; it takes bodies up to 64 MiB (engine-sim's
// bound) and reads them through a 1 MiB buffer, so a long prompt is never
// refused (413) nor spooled to a temporary file.
const nginxConfig = `worker_processes 2;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events { worker_connections 16384; }
http {
  access_log off;
  client_max_body_size 64m;
  client_body_buffer_size 1m;
  client_body_temp_path %[1]s/body;
  proxy_temp_path %[1]s/proxy;
  fastcgi_temp_path %[1]s/fastcgi;
  uwsgi_temp_path %[1]s/uwsgi;
  scgi_temp_path %[1]s/scgi;
  upstream engine { server 127.0.0.1:%[2]d; keepalive 256; }
  server {
    listen 127.0.0.1:%[3]d backlog=%[4]d;
    location / {
      proxy_pass http://engine;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
    }
  }
}
`

// startNginx writes a configuration into dir and starts nginx in the
// foreground on port, proxying to the engine on upstream.
func startNginx(dir, bin string, port, upstream int) (*proc, error) {
	d := filepath.Join(dir, fmt.Sprintf("nginx-%d", port))
	if err := os.MkdirAll(d, 0o755); err != nil {
		return nil, err
	}
	conf := filepath.Join(d, "nginx.conf")
	if err := os.WriteFile(conf, fmt.Appendf(nil, nginxConfig, d, upstream, port, listenBacklog()), 0o644); err != nil {
		return nil, err
	}
	return start(dir, fmt.Sprintf("nginx-%d", port), bin, "-p", d, "-c", conf, "-g", "daemon off;")
}

// listenBacklog is the backlog Go's listeners ask for on Linux: the
// kernel's net.core.somaxconn, syscall.SOMAXCONN where it cannot be read.
func listenBacklog() int {
	if b, err := os.ReadFile("/proc/sys/net/core/somaxconn"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n > 0 {
			return n
		}
	}
	return syscall.SOMAXCONN
}
