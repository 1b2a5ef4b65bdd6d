// The cost of one ES256 signature by libcrypto, as brokerd's DPoP proofs make it
// (docs/performance.md, "DPoP proofs"): CPU time per signature on 1 and on 2 threads at once,
// with a context set up for each signature (EVP_DigestSignInit, then EVP_DigestSign) against one
// kept per thread (EVP_PKEY_sign of the message's SHA-256), the private scalar in OpenSSL's
// secure heap and outside it. Not part of the tests.
//   gcc -O2 -Wall -Werror -o es256_sign bench/es256_sign.c -lcrypto -lpthread && ./es256_sign [SIGNATURES]
#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/obj_mac.h>
#include <openssl/param_build.h>
#include <openssl/sha.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct run {
    EVP_PKEY *key;
    int kept;  // 1: one context kept for every signature; 0: one set up per signature
    int count;
    double cpu_seconds;
    int failed;
};

static double thread_cpu_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

// A P-256 key made from its parameters, as brokerd makes it: the scalar in the secure heap
// when `secure`.
static EVP_PKEY *make_key(int secure) {
    EC_GROUP *group = EC_GROUP_new_by_curve_name(NID_X9_62_prime256v1);
    BIGNUM *scalar = secure ? BN_secure_new() : BN_new();
    EC_POINT *point = EC_POINT_new(group);
    unsigned char encoded[65];
    OSSL_PARAM_BLD *builder = OSSL_PARAM_BLD_new();
    EVP_PKEY_CTX *context = EVP_PKEY_CTX_new_from_name(NULL, "EC", NULL);
    EVP_PKEY *key = NULL;
    OSSL_PARAM *parameters = NULL;
    if (group && scalar && point && builder && context && BN_rand_range(scalar, EC_GROUP_get0_order(group)) &&
        EC_POINT_mul(group, point, scalar, NULL, NULL, NULL) &&
        EC_POINT_point2oct(group, point, POINT_CONVERSION_UNCOMPRESSED, encoded, 65, NULL) == 65 &&
        OSSL_PARAM_BLD_push_utf8_string(builder, OSSL_PKEY_PARAM_GROUP_NAME, SN_X9_62_prime256v1, 0) &&
        OSSL_PARAM_BLD_push_BN(builder, OSSL_PKEY_PARAM_PRIV_KEY, scalar) &&
        OSSL_PARAM_BLD_push_octet_string(builder, OSSL_PKEY_PARAM_PUB_KEY, encoded, 65) &&
        (parameters = OSSL_PARAM_BLD_to_param(builder)) && EVP_PKEY_fromdata_init(context) == 1)
        EVP_PKEY_fromdata(context, &key, EVP_PKEY_KEYPAIR, parameters);
    OSSL_PARAM_free(parameters);
    EVP_PKEY_CTX_free(context);
    OSSL_PARAM_BLD_free(builder);
    EC_POINT_free(point);
    BN_clear_free(scalar);
    EC_GROUP_free(group);
    return key;
}

static void *sign_all(void *argument) {
    struct run *run = argument;
    // A proof's size: header and claims in base64url.
    unsigned char message[400];
    memset(message, 'e', sizeof message);
    EVP_PKEY_CTX *kept = NULL;
    if (run->kept && (!(kept = EVP_PKEY_CTX_new_from_pkey(NULL, run->key, NULL)) || EVP_PKEY_sign_init(kept) != 1)) {
        run->failed = 1;
        return NULL;
    }
    double start = thread_cpu_seconds();
    for (int i = 0; i < run->count && !run->failed; i++) {
        message[i % sizeof message] ^= 1;
        unsigned char der[80];
        size_t length = sizeof der;
        if (run->kept) {
            unsigned char digest[SHA256_DIGEST_LENGTH];
            SHA256(message, sizeof message, digest);
            run->failed = EVP_PKEY_sign(kept, der, &length, digest, sizeof digest) != 1;
        } else {
            EVP_MD_CTX *context = EVP_MD_CTX_new();
            run->failed = !context || EVP_DigestSignInit(context, NULL, EVP_sha256(), NULL, run->key) != 1 ||
                          EVP_DigestSign(context, der, &length, message, sizeof message) != 1;
            EVP_MD_CTX_free(context);
        }
    }
    run->cpu_seconds = thread_cpu_seconds() - start;
    EVP_PKEY_CTX_free(kept);
    return NULL;
}

int main(int argc, char **argv) {
    int count = argc > 1 ? atoi(argv[1]) : 5000;
    if (count < 1 || CRYPTO_secure_malloc_init(1 << 20, 32) == 0) return 2;
    EVP_PKEY *keys[2] = {make_key(0), make_key(1)};
    if (!keys[0] || !keys[1]) return 2;
    for (int secure = 0; secure < 2; secure++)
        for (int kept = 0; kept < 2; kept++)
            for (int threads = 1; threads <= 2; threads++) {
                struct run runs[2];
                pthread_t ids[2];
                double cpu = 0;
                for (int t = 0; t < threads; t++) {
                    runs[t] = (struct run){keys[secure], kept, count, 0, 0};
                    if (pthread_create(&ids[t], NULL, sign_all, &runs[t]) != 0) return 2;
                }
                for (int t = 0; t < threads; t++) {
                    pthread_join(ids[t], NULL);
                    if (runs[t].failed) return 1;
                    cpu += runs[t].cpu_seconds;
                }
                printf("scalar %-14s context %-22s %d thread(s): %5.1f us of CPU per signature\n",
                       secure ? "in secure heap" : "outside it", kept ? "kept (EVP_PKEY_sign)" : "per signature",
                       threads, cpu / (count * threads) * 1e6);
            }
    EVP_PKEY_free(keys[0]);
    EVP_PKEY_free(keys[1]);
    return 0;
}
