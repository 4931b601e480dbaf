// Package trust owns a cluster's identity: its certificate authority, the
// certificates of its nodes and clients, the gossip key, the files that
// hold them, and the TLS configurations built from them (SECURITY.md).
//
// A credentials directory holds
//
//	ca.crt       the cluster CA's certificate (every node and client)
//	ca.key       its private key (only where certificates are issued)
//	gossip.key   the gossip encryption key (every node)
//	NAME.crt     a node's or client's certificate, signed by the CA
//	NAME.key     its private key
//
// Files and directory are checked as ssh checks its own: [Load] refuses
// a directory that group or others may write to, key files that group or
// others may read (0600 is right) or that another user owns, and
// certificates that group or others may write (see [ErrPermissions]). A node's certificate names the node (its common
// name and a DNS name) and carries the role "node" as its organizational
// unit; a client's carries "client". Both may authenticate as TLS clients;
// only nodes serve.
package trust

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Roles of certificates.
const (
	RoleNode   = "node"
	RoleClient = "client"
)

// Files of a credentials directory.
const (
	CACert    = "ca.crt"
	CAKey     = "ca.key"
	GossipKey = "gossip.key"
	// ClientName is the client certificate `ppnode init` issues for the
	// CLI.
	ClientName = "client"
)

// validity of the certificates issued.
const (
	caValidity   = 10 * 365 * 24 * time.Hour
	certValidity = 2 * 365 * 24 * time.Hour
)

// Init creates a cluster in dir: a CA, a gossip key and a client
// certificate for the CLI. It refuses a dir that already holds a CA.
func Init(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := CheckDir(dir); err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(dir, CACert)); err == nil {
		return fmt.Errorf("trust: %s already holds a cluster CA", dir)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "ppnode cluster CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return err
	}
	if err := writeKey(filepath.Join(dir, CAKey), key); err != nil {
		return err
	}
	if err := writePEM(filepath.Join(dir, CACert), "CERTIFICATE", der, 0o644); err != nil {
		return err
	}
	gk := make([]byte, 32)
	rand.Read(gk)
	if err := os.WriteFile(filepath.Join(dir, GossipKey), []byte(hex.EncodeToString(gk)+"\n"), 0o600); err != nil {
		return err
	}
	_, err = Issue(dir, ClientName, RoleClient, nil)
	return err
}

// Issue signs a certificate for name with the CA in dir and writes
// NAME.crt and NAME.key there. hosts are the addresses (IPs or DNS names)
// the node serves at, besides its name. It returns the certificate's path.
func Issue(dir, name, role string, hosts []string) (string, error) {
	if err := CheckName(name); err != nil {
		return "", err
	}
	if role != RoleNode && role != RoleClient {
		return "", fmt.Errorf("trust: role %q: want %q or %q", role, RoleNode, RoleClient)
	}
	if err := CheckDir(dir); err != nil {
		return "", err
	}
	caCert, err := readCert(filepath.Join(dir, CACert))
	if err != nil {
		return "", err
	}
	caKey, err := readKey(filepath.Join(dir, CAKey))
	if err != nil {
		return "", err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: name, OrganizationalUnit: []string{role}},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(certValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if role == RoleNode {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
		tmpl.DNSNames = []string{name, "localhost"}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
		for _, h := range hosts {
			if ip := net.ParseIP(h); ip != nil {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			} else {
				tmpl.DNSNames = append(tmpl.DNSNames, h)
			}
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return "", err
	}
	if err := writeKey(filepath.Join(dir, name+".key"), key); err != nil {
		return "", err
	}
	path := filepath.Join(dir, name+".crt")
	return path, writePEM(path, "CERTIFICATE", der, 0o644)
}

// CheckName checks a node or client name: 1 to 64 bytes of [A-Za-z0-9_.-],
// not starting with a dot (names appear in file names, records and logs).
func CheckName(name string) error {
	if name == "" || len(name) > 64 || name[0] == '.' {
		return fmt.Errorf("trust: name %q: want 1 to 64 of A-Z a-z 0-9 _ . - , not starting with a dot", name)
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-' || r == '.') {
			return fmt.Errorf("trust: name %q: want 1 to 64 of A-Z a-z 0-9 _ . - , not starting with a dot", name)
		}
	}
	return nil
}

// Identity is what a node or client holds of the cluster's trust.
type Identity struct {
	Name string
	Role string
	// Pool holds the cluster CA.
	Pool *x509.CertPool
	Cert tls.Certificate
	// Gossip is the gossip key (nodes only; nil for clients).
	Gossip []byte
}

// Load reads the identity name from dir: the CA, NAME.crt and NAME.key,
// and for a node the gossip key. Credentials others could read or change
// are refused ([ErrPermissions]).
func Load(dir, name string) (*Identity, error) {
	if err := CheckDir(dir); err != nil {
		return nil, err
	}
	ca, err := readCert(filepath.Join(dir, CACert))
	if err != nil {
		return nil, err
	}
	crtPath, keyPath := filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if err := CheckKeyFile(keyPath); err != nil {
		return nil, err
	}
	if err := checkCertFile(crtPath); err != nil {
		return nil, err
	}
	cert, err := tls.LoadX509KeyPair(crtPath, keyPath)
	if err != nil {
		return nil, fmt.Errorf("trust: %s: %w", name, err)
	}
	leaf := cert.Leaf
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return nil, fmt.Errorf("trust: %s is not signed by the cluster CA in %s: %w", crtPath, dir, err)
	}
	id := &Identity{Name: leaf.Subject.CommonName, Role: roleOf(leaf), Pool: pool, Cert: cert}
	if id.Role == RoleNode {
		if id.Gossip, err = ReadKey(filepath.Join(dir, GossipKey)); err != nil {
			return nil, err
		}
	}
	return id, nil
}

func roleOf(c *x509.Certificate) string {
	if len(c.Subject.OrganizationalUnit) == 1 {
		return c.Subject.OrganizationalUnit[0]
	}
	return ""
}

// Peer is the authenticated other end of a connection.
type Peer struct {
	Name, Role string
}

// PeerOf returns the peer a TLS connection state verified, or false.
func PeerOf(cs *tls.ConnectionState) (Peer, bool) {
	if cs == nil || len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return Peer{}, false
	}
	leaf := cs.VerifiedChains[0][0]
	return Peer{Name: leaf.Subject.CommonName, Role: roleOf(leaf)}, true
}

// ServerTLS is the configuration of a node's servers: its certificate,
// and clients verified against the cluster CA when they present one
// (required reports whether they must).
func (id *Identity) ServerTLS(required bool) *tls.Config {
	auth := tls.VerifyClientCertIfGiven
	if required {
		auth = tls.RequireAndVerifyClientCert
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{id.Cert},
		ClientCAs:    id.Pool,
		ClientAuth:   auth,
	}
}

// ClientTLS is the configuration of a connection to a node: the node's
// certificate must be signed by the cluster CA (its name is not checked:
// nodes are reached at addresses, and every CA-signed node is a member),
// and this identity's certificate is presented.
func (id *Identity) ClientTLS() *tls.Config {
	pool := id.Pool
	return &tls.Config{
		MinVersion:         tls.VersionTLS13,
		Certificates:       []tls.Certificate{id.Cert},
		InsecureSkipVerify: true, // verified below, against the cluster CA only
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("trust: the node sent no certificate")
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			leaf := cs.PeerCertificates[0]
			if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
				return fmt.Errorf("trust: the node's certificate is not the cluster's: %w", err)
			}
			if roleOf(leaf) != RoleNode {
				return fmt.Errorf("trust: %q is not a node", leaf.Subject.CommonName)
			}
			return nil
		},
	}
}

// DataPlaneKey is the key the data plane's handshakes prove knowledge
// of, derived from the gossip key.
func (id *Identity) DataPlaneKey() []byte {
	h := sha256.New()
	h.Write([]byte("ppnode data plane key\x00"))
	h.Write(id.Gossip)
	return h.Sum(nil)
}

// ReadKey reads a gossip key file as Init writes it (32 bytes in hex)
// after checking its mode.
func ReadKey(path string) ([]byte, error) {
	if err := CheckKeyFile(path); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	k, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(k) != 16 && len(k) != 24 && len(k) != 32 {
		return nil, fmt.Errorf("trust: %s: want a 16, 24 or 32-byte key in hex", path)
	}
	return k, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	return writePEM(path, "PRIVATE KEY", der, 0o600)
}

func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return fmt.Errorf("trust: %w", err)
	}
	if err := pem.Encode(f, &pem.Block{Type: typ, Bytes: der}); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func readPEM(path, typ string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("trust: %w", err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != typ {
		return nil, fmt.Errorf("trust: %s holds no PEM %s", path, typ)
	}
	return blk.Bytes, nil
}

func readCert(path string) (*x509.Certificate, error) {
	if err := checkCertFile(path); err != nil {
		return nil, err
	}
	der, err := readPEM(path, "CERTIFICATE")
	if err != nil {
		return nil, err
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("trust: %s: %w", path, err)
	}
	return c, nil
}

func readKey(path string) (*ecdsa.PrivateKey, error) {
	if err := CheckKeyFile(path); err != nil {
		return nil, err
	}
	der, err := readPEM(path, "PRIVATE KEY")
	if err != nil {
		return nil, err
	}
	k, err := x509.ParsePKCS8PrivateKey(der)
	if err != nil {
		return nil, fmt.Errorf("trust: %s: %w", path, err)
	}
	ek, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("trust: %s: not an ECDSA key", path)
	}
	return ek, nil
}
