# Helpers for the NBD-over-TLS tests, sourced on top of nbd-lib.sh: certificates and PSK
# keys made with certtool and psktool (Debian gnutls-bin) in a directory of the test.
#
# tls_make DIR makes, in QEMU's and libnbd's file names:
#   DIR/srv          ca-cert.pem server-cert.pem server-key.pem (CN=localhost, IP 127.0.0.1)
#   DIR/cli          ca-cert.pem client-cert.pem client-key.pem (C=GB,O=ioplane test,CN=client1)
#   DIR/cli2         the same CA, another name (CN=client2): unauthorised where authz is set
#   DIR/cli-expired  the same CA and name as cli, valid from 2020-01-01 to 2020-06-01
#   DIR/cli-otherca  a certificate and CA cert from another CA
#   DIR/srv-expired  a server certificate that has expired
#   DIR/psk/keys.psk alice's key; DIR/psk-bad/keys.psk another key for alice

tls_need() {
	nbd_need certtool psktool
}

# tls_template FILE LINES...: a certtool template.
tls_template() {
	local f=$1
	shift
	printf '%s\n' "$@" >"$f"
}

# tls_ca DIR NAME: a self-signed CA (DIR/NAME-key.pem, DIR/NAME-cert.pem).
tls_ca() {
	tls_template "$1/$2.info" "cn = \"ioplane test $2\"" ca cert_signing_key \
		"expiration_days = 2"
	certtool --generate-privkey --outfile "$1/$2-key.pem" >/dev/null 2>&1
	certtool --generate-self-signed --load-privkey "$1/$2-key.pem" \
		--template "$1/$2.info" --outfile "$1/$2-cert.pem" >/dev/null 2>&1
}

# tls_cert DIR CA KIND OUTDIR TEMPLATE-LINES...: key and certificate signed by CA, as
# OUTDIR/KIND-key.pem and OUTDIR/KIND-cert.pem, with the CA's certificate as ca-cert.pem.
tls_cert() {
	local d=$1 ca=$2 kind=$3 out=$4
	shift 4
	mkdir -p "$out"
	tls_template "$out/$kind.info" "$@"
	cp "$d/$ca-cert.pem" "$out/ca-cert.pem"
	certtool --generate-privkey --outfile "$out/$kind-key.pem" >/dev/null 2>&1
	certtool --generate-certificate --load-privkey "$out/$kind-key.pem" \
		--load-ca-certificate "$d/$ca-cert.pem" --load-ca-privkey "$d/$ca-key.pem" \
		--template "$out/$kind.info" --outfile "$out/$kind-cert.pem" >/dev/null 2>&1 ||
		fail "certtool could not make $out/$kind-cert.pem"
}

tls_make() {
	local d=$1 client=(country=GB 'organization = "ioplane test"')
	local cuse=(tls_www_client encryption_key signing_key)
	local suse=(tls_www_server encryption_key signing_key)
	local past=('activation_date = "2020-01-01 00:00:00"'
		'expiration_date = "2020-06-01 00:00:00"')
	mkdir -p "$d"
	tls_ca "$d" ca
	tls_ca "$d" otherca
	tls_cert "$d" ca server "$d/srv" 'organization = "ioplane test"' 'cn = "localhost"' \
		'dns_name = "localhost"' 'ip_address = "127.0.0.1"' "${suse[@]}" \
		"expiration_days = 2"
	tls_cert "$d" ca server "$d/srv-expired" 'cn = "localhost"' \
		'ip_address = "127.0.0.1"' "${suse[@]}" "${past[@]}"
	tls_cert "$d" ca client "$d/cli" "${client[@]}" 'cn = "client1"' "${cuse[@]}" \
		"expiration_days = 2"
	tls_cert "$d" ca client "$d/cli2" "${client[@]}" 'cn = "client2"' "${cuse[@]}" \
		"expiration_days = 2"
	tls_cert "$d" ca client "$d/cli-expired" "${client[@]}" 'cn = "client1"' \
		"${cuse[@]}" "${past[@]}"
	tls_cert "$d" otherca client "$d/cli-otherca" "${client[@]}" 'cn = "client1"' \
		"${cuse[@]}" "expiration_days = 2"
	# The client of another CA trusts our server's CA: only its own certificate is wrong.
	cp "$d/ca-cert.pem" "$d/cli-otherca/ca-cert.pem"
	mkdir -p "$d/psk" "$d/psk-bad"
	psktool -u alice -p "$d/psk/keys.psk" >/dev/null 2>&1
	psktool -u alice -p "$d/psk-bad/keys.psk" >/dev/null 2>&1
	cmp -s "$d/psk/keys.psk" "$d/psk-bad/keys.psk" && fail "psktool made the same key twice"
	return 0
}

# tls_wait_port PID PORT: wait until PORT listens (bounded), or fail if PID exits.
tls_wait_port() {
	local i
	for ((i = 0; i < NBD_WAIT_SECS * 20; i++)); do
		kill -0 "$1" 2>/dev/null || fail "server $1 exited during start-up"
		nbd_tcp_listening "$2" && return 0
		sleep 0.05
	done
	fail "nothing listens on port $2 after ${NBD_WAIT_SECS}s"
}

# tls_serve CMD ARGS...: start CMD (ioplane serve or qemu-storage-daemon) with qsd's
# arguments in the background, log in NBD_LOG, wait for the --nbd-server port ($TLS_PORT).
tls_serve() {
	nbd_nserve=$((nbd_nserve + 1))
	NBD_LOG=$NBD_TMP/serve-$nbd_nserve.log
	echo "+ $*" >"$NBD_LOG"
	"$@" </dev/null >>"$NBD_LOG" 2>&1 &
	NBD_PID=$!
	nbd_pids+=("$NBD_PID")
	nbd_logs+=("$NBD_LOG")
	tls_wait_port "$NBD_PID" "$TLS_PORT"
}
