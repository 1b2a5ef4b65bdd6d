// OpenSSL 3's EC_KEY and ECDSA_sign_setup are deprecated in favour of EVP_PKEY, which has no
// way to sign with a nonce computed ahead (docs/dpop.md, "Signing"); the deprecation marks are
// left out so that the imported functions do not warn.
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/bn.h>
#include <openssl/crypto.h>
#include <openssl/ec.h>
#include <openssl/ecdsa.h>
#include <openssl/obj_mac.h>
