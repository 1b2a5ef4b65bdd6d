// libcrypto's EVP interface for ES256 keys and signatures (OpenSSL 3, none of it deprecated):
// keys built from their parameters (EVP_PKEY_fromdata), signatures made whole
// (EVP_PKEY_sign of a digest), and the group arithmetic that derives a public key.
#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/obj_mac.h>
#include <openssl/param_build.h>

// EVP_PKEY_KEYPAIR, a macro Swift does not import.
static const int COpenSSLKeyPair = EVP_PKEY_KEYPAIR;

// Names libcrypto keeps pointers to (an OSSL_PARAM's key and a pushed string are not copied
// until OSSL_PARAM_BLD_to_param, and the key never is): C strings with static storage, which a
// Swift string passed in their place would not be.
static const char *const COpenSSLGroupNameKey = OSSL_PKEY_PARAM_GROUP_NAME;
static const char *const COpenSSLPrivateKeyKey = OSSL_PKEY_PARAM_PRIV_KEY;
static const char *const COpenSSLPublicKeyKey = OSSL_PKEY_PARAM_PUB_KEY;
static const char *const COpenSSLP256 = SN_X9_62_prime256v1;
static const char *const COpenSSLEC = "EC";
